"""The project's workflows: refresh, rollback, status, retention and leases from dpone.toml."""
