"""The PostgreSQL store: the same contract as the file store, for teams on several machines."""
