import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from kudos import sizes
from kudos.models import TextModel


class Command(BaseCommand):
    help = (
        "Load model sizes from the AI Horde's text model reference JSON ({name: {parameters, ...}}): "
        "new models are added and known ones updated; none is removed."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("path", type=Path)

    def handle(self, *args, path: Path, **options) -> None:
        try:
            reference = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise CommandError(f"{path}: {exc}") from None
        if not isinstance(reference, dict):
            raise CommandError(f"{path}: not a JSON object of models")
        found = {
            name: int(entry["parameters"])
            for name, entry in reference.items()
            if isinstance(entry, dict)
            and str(entry.get("parameters", "")).isdigit()
            and int(entry["parameters"]) > 0
        }
        TextModel.objects.bulk_create(
            [TextModel(name=name[:255], parameters=size) for name, size in found.items()],
            update_conflicts=True,
            unique_fields=["name"],
            update_fields=["parameters"],
        )
        sizes.forget()
        skipped = len(reference) - len(found)
        self.stdout.write(f"{len(found)} text models loaded, {skipped} without a size skipped")
