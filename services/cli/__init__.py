"""The `offerbus` command: bring a local cluster up and down, and answer the operator's
questions (what runs where, logs, kill) from the leading master."""
