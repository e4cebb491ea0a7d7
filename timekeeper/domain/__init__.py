"""The ideas every domain shares, decided without the database: periods, figures, states, weights."""
