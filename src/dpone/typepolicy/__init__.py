"""The finite SQL Server to ClickHouse type policy and its exact converters."""

from dpone.typepolicy.converters import Refused
from dpone.typepolicy.policy import (
    POLICY_ID,
    POLICY_VERSION,
    ColumnPlan,
    column_problems,
    plan_column,
    plan_columns,
    refusal,
    refusals,
)

__all__ = [
    "POLICY_ID",
    "POLICY_VERSION",
    "ColumnPlan",
    "Refused",
    "column_problems",
    "plan_column",
    "plan_columns",
    "refusal",
    "refusals",
]
