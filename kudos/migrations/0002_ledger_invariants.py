"""The ledger's invariants, held by PostgreSQL: an event's postings sum to zero when its
transaction commits, and postings and events are never updated or deleted."""

from django.db import migrations

INVARIANTS = """
CREATE FUNCTION kudos_event_balances() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT sum(amount) FROM kudos_posting WHERE event_id = NEW.event_id) <> 0 THEN
        RAISE EXCEPTION 'kudos event % does not sum to zero', NEW.event_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER kudos_event_balances AFTER INSERT ON kudos_posting
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION kudos_event_balances();

CREATE FUNCTION kudos_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the kudos ledger is append-only: post a correcting event instead'
        USING ERRCODE = 'restrict_violation';
END $$;
CREATE TRIGGER kudos_posting_append_only BEFORE UPDATE OR DELETE ON kudos_posting
    FOR EACH ROW EXECUTE FUNCTION kudos_append_only();
CREATE TRIGGER kudos_event_append_only BEFORE UPDATE OR DELETE ON kudos_event
    FOR EACH ROW EXECUTE FUNCTION kudos_append_only();
"""

UNDO = """
DROP TRIGGER kudos_event_append_only ON kudos_event;
DROP TRIGGER kudos_posting_append_only ON kudos_posting;
DROP FUNCTION kudos_append_only();
DROP TRIGGER kudos_event_balances ON kudos_posting;
DROP FUNCTION kudos_event_balances();
"""


class Migration(migrations.Migration):
    dependencies = [("kudos", "0001_initial")]

    operations = [migrations.RunSQL(INVARIANTS, UNDO)]
