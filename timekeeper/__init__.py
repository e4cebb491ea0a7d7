"""The timekeeper: owns every namespace's GPU-minute budget and the usage ledger."""
