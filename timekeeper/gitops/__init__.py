"""Budgets as Kubernetes objects (GPUBudget, GPUBudgetDefault; docs/gitops.md): the jobs' leader's
sync copies their specs into the database and the database's figures into their status, and the budget
API refuses REST changes to what an object governs."""
