"""Notifications (issue 40): events written to an outbox in the transaction of the change that
causes them (``outbox``), delivered at least once to the sinks the settings name (``sinks``,
``deliver``), in order per job, by a bounded step at the end of each daemon round."""
