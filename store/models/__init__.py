"""SQLAlchemy 2 typed models: the record Parley keeps in PostgreSQL, one module per concept.

Temporal holds execution state; these tables hold what the product shows and what the next
prompt is built from. Every schema change also gets an Alembic migration.
"""

from parley.store.models.branches import Branch
from parley.store.models.core import (
    Action,
    ApiToken,
    Base,
    ChatSession,
    Message,
    ModelCall,
    ResultSet,
    SessionSlot,
    SpecialistAnswer,
    StreamLease,
    Tenant,
    ToolCall,
    TraceSpan,
    Turn,
    TurnEvent,
    UsageCounter,
    User,
)
from parley.store.models.costs import (
    BudgetApproval,
    BudgetHold,
    BudgetNotice,
    BudgetSpend,
    ModelCost,
)
from parley.store.models.erasure import Erasure
from parley.store.models.handoffs import Handoff, HandoffEvent, HandoffNote, WebhookDelivery
from parley.store.models.imports import ConversationImport
from parley.store.models.knowledge import (
    KnowledgeChunk,
    KnowledgeDocument,
)
from parley.store.models.live import SessionEvent
from parley.store.models.memory import (
    ConversationSummary,
    MemoryConsent,
    PinnedFactRow,
    UserMemoryItem,
)
from parley.store.models.queue import QueuedMessage
from parley.store.models.uploads import (
    Export,
    Feedback,
    SessionFile,
)

__all__ = [
    "Base",
    "Tenant",
    "User",
    "ApiToken",
    "ChatSession",
    "Message",
    "Turn",
    "UsageCounter",
    "StreamLease",
    "TurnEvent",
    "ModelCall",
    "ModelCost",
    "BudgetSpend",
    "BudgetHold",
    "BudgetApproval",
    "BudgetNotice",
    "ToolCall",
    "Action",
    "SessionSlot",
    "SpecialistAnswer",
    "Handoff",
    "HandoffNote",
    "HandoffEvent",
    "WebhookDelivery",
    "TraceSpan",
    "ResultSet",
    "ConversationSummary",
    "PinnedFactRow",
    "MemoryConsent",
    "UserMemoryItem",
    "KnowledgeDocument",
    "KnowledgeChunk",
    "SessionFile",
    "Feedback",
    "Export",
    "Erasure",
    "QueuedMessage",
    "ConversationImport",
    "Branch",
    "SessionEvent",
]
