"""Reports: the usage ledger, each pod's charged time, and where the minutes went."""
