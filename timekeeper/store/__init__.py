"""The tables and the repositories that read and write them: one floor every domain's services compose."""
