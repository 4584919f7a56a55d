"""A mixture weighted in tokens, packed into full rows: quotas, source streams, rows and the plan (numpy only)."""

from .plan import TokenMixturePlan, TokenStop
from .quotas import EpochQuotas, QuotaSegment
from .rows import cut_rows
from .streams import SourceStream

__all__ = ["EpochQuotas", "QuotaSegment", "SourceStream", "TokenMixturePlan", "TokenStop", "cut_rows"]
