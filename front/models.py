"""What the operator writes for people to read: the horde's news and its documents (terms,
privacy, sponsors), served by the AI Horde's routes (`front/documents.py`) and edited in the
admin (`front/admin/documents.py`)."""

from django.contrib.postgres.fields import ArrayField
from django.db import models


class Newspiece(models.Model):
    """One piece of `GET /api/v2/status/news`, with the AI Horde's fields (its `news.json`)."""

    class Importance(models.TextChoices):
        # The values the AI Horde's own news uses; clients colour by them.
        INFORMATION = "Information"
        WORKERS = "Workers"
        INTEGRATION = "Integration"
        UPCOMING = "Upcoming"
        CRISIS = "Crisis"

    date_published = models.DateField()
    title = models.CharField(max_length=200)
    newspiece = models.TextField(
        help_text="The news itself; Markdown links are shown as links by most clients."
    )
    importance = models.CharField(max_length=20, choices=Importance.choices, default=Importance.INFORMATION)
    tags = ArrayField(models.CharField(max_length=50), default=list, blank=True, help_text="Comma-separated.")
    more_info_urls = ArrayField(
        models.URLField(max_length=500), default=list, blank=True, help_text="Comma-separated."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # Newest first, as the AI Horde sorts them; the latest written first within a day.
        ordering = ("-date_published", "-id")
        verbose_name = "news piece"

    def __str__(self) -> str:
        return f"{self.date_published}: {self.title}"


class HordeDocument(models.Model):
    """One of the horde's documents, in the two formats its route serves, each as written."""

    class Kind(models.TextChoices):
        TERMS = "terms", "Terms of service"
        PRIVACY = "privacy", "Privacy policy"
        SPONSORS = "sponsors", "Sponsors"

    kind = models.CharField(max_length=20, choices=Kind.choices, unique=True)
    html = models.TextField(blank=True, help_text="Served as it is written to `format=html` (the default).")
    markdown = models.TextField(blank=True, help_text="Served as it is written to `format=markdown`.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("kind",)
        verbose_name = "document"

    def __str__(self) -> str:
        return self.get_kind_display()
