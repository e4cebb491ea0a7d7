"""Budget pools: one budget shared by several namespaces, with optional caps per member."""
