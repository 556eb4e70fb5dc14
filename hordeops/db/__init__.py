"""PostgreSQL as Django's backend has it, with connection waits bounded (`hordeops.dbwait`)."""
