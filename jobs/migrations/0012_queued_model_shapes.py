import django.db.models.expressions
from django.db import migrations, models

# The rows now carry the request's shape too (`jobs.models.QUEUE_SHAPE`). The same trigger
# as in 0010, writing the shape; a change of shape moves the rows as a change of order does.
# The rows are written again from the requests: before the columns exist, none can be kept.
SHAPE_COLUMNS = "kind, max_length, max_context_length, trusted_workers, targeted"
SYNC_FUNCTION = f"""
CREATE OR REPLACE FUNCTION jobs_request_queued_models() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'UPDATE' THEN
    IF (OLD.state = 'active' AND OLD.queued > 0) = (NEW.state = 'active' AND NEW.queued > 0)
       AND OLD.requested_models = NEW.requested_models AND OLD.priority = NEW.priority
       AND OLD.fair_rank = NEW.fair_rank AND OLD.created_at = NEW.created_at
       AND OLD.kind = NEW.kind AND OLD.max_length = NEW.max_length
       AND OLD.max_context_length = NEW.max_context_length
       AND OLD.trusted_workers = NEW.trusted_workers
       AND cardinality(OLD.allowed_workers) = cardinality(NEW.allowed_workers) THEN
      RETURN NULL;
    END IF;
    DELETE FROM jobs_queuedmodel WHERE request_id = OLD.id;
  END IF;
  IF NEW.state = 'active' AND NEW.queued > 0 THEN
    INSERT INTO jobs_queuedmodel (request_id, model, fair_rank, priority, created_at, {SHAPE_COLUMNS})
    SELECT NEW.id, m, NEW.fair_rank, NEW.priority, NEW.created_at, NEW.kind, NEW.max_length,
           NEW.max_context_length, NEW.trusted_workers, cardinality(NEW.allowed_workers) > 0
    FROM unnest(CASE WHEN cardinality(NEW.requested_models) = 0 THEN ARRAY['']::varchar[]
                     ELSE NEW.requested_models END) AS m
    ON CONFLICT DO NOTHING;
  END IF;
  RETURN NULL;
END $$;
DROP TRIGGER jobs_request_queued_models ON jobs_textrequest;
CREATE TRIGGER jobs_request_queued_models
  AFTER INSERT OR UPDATE OF state, queued, requested_models, priority, fair_rank, created_at,
    kind, max_length, max_context_length, trusted_workers, allowed_workers
  ON jobs_textrequest FOR EACH ROW EXECUTE FUNCTION jobs_request_queued_models();
INSERT INTO jobs_queuedmodel (request_id, model, fair_rank, priority, created_at, {SHAPE_COLUMNS})
SELECT r.id, m, r.fair_rank, r.priority, r.created_at, r.kind, r.max_length, r.max_context_length,
       r.trusted_workers, cardinality(r.allowed_workers) > 0
FROM jobs_textrequest AS r,
     unnest(CASE WHEN cardinality(r.requested_models) = 0 THEN ARRAY['']::varchar[]
                 ELSE r.requested_models END) AS m
WHERE r.state = 'active' AND r.queued > 0
ON CONFLICT DO NOTHING;
"""


def _previous() -> tuple[str, str]:
    """0010's function and trigger, and its refill of the rows, apart: going back, the first
    runs while the shape columns still exist (the rows are emptied), the second once they are
    gone."""
    from importlib import import_module

    sync = import_module("jobs.migrations.0010_queued_models").SYNC_FUNCTION
    refill = sync.index("\nINSERT INTO jobs_queuedmodel")
    return sync[:refill], sync[refill:]


UNSYNC_FUNCTION = """
DROP TRIGGER jobs_request_queued_models ON jobs_textrequest;
DROP FUNCTION jobs_request_queued_models();
DELETE FROM jobs_queuedmodel;
"""
PREVIOUS_FUNCTION, PREVIOUS_REFILL = _previous()


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0011_queue_position_index"),
    ]

    operations = [
        migrations.RunSQL("DELETE FROM jobs_queuedmodel", PREVIOUS_REFILL),
        migrations.AddField(
            model_name="queuedmodel",
            name="kind",
            field=models.CharField(choices=[("text", "Text"), ("chat", "Chat")], default="text", max_length=8),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="queuedmodel",
            name="max_length",
            field=models.PositiveIntegerField(default=0),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="queuedmodel",
            name="max_context_length",
            field=models.PositiveIntegerField(default=0),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="queuedmodel",
            name="trusted_workers",
            field=models.BooleanField(default=False),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="queuedmodel",
            name="targeted",
            field=models.BooleanField(default=False),
            preserve_default=False,
        ),
        migrations.RemoveIndex(model_name="queuedmodel", name="queued_model_order"),
        migrations.AddIndex(
            model_name="queuedmodel",
            index=models.Index(
                models.F("model"),
                django.db.models.expressions.OrderBy(models.F("fair_rank")),
                django.db.models.expressions.OrderBy(models.F("priority"), descending=True),
                django.db.models.expressions.OrderBy(models.F("created_at")),
                condition=models.Q(("fair_rank__gte", 0)),
                name="queued_model_order",
            ),
        ),
        migrations.AddIndex(
            model_name="queuedmodel",
            index=models.Index(
                models.F("model"),
                models.F("kind"),
                models.F("max_length"),
                models.F("max_context_length"),
                models.F("trusted_workers"),
                models.F("targeted"),
                django.db.models.expressions.OrderBy(models.F("fair_rank")),
                django.db.models.expressions.OrderBy(models.F("priority"), descending=True),
                django.db.models.expressions.OrderBy(models.F("created_at")),
                name="queued_model_shape",
            ),
        ),
        migrations.RunSQL(SYNC_FUNCTION, UNSYNC_FUNCTION + PREVIOUS_FUNCTION),
    ]
