"""Billing: weights per GPU model (what a minute on each GPU counts for), prices, the chargeback export."""
