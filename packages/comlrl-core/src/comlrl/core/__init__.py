"""comlrl.core: interfaces and records shared by every CoMLRL package."""

from __future__ import annotations

from comlrl.core.agent import Agent, SamplingParams
from comlrl.core.prompts import ChatPrompt, Prompt, chat_messages, prompt_key, prompt_text
from comlrl.core.records import Completion, Feedback, JointAction, TurnRecord
from comlrl.core.reward import (
    JointReward,
    RewardBatch,
    RewardFunctionError,
    as_joint_reward,
    check_reward_arity,
    check_rewards,
)
from comlrl.core.task import (
    ENTRY_POINT_GROUP,
    Task,
    TaskNotFoundError,
    available_tasks,
    get_task,
)
from comlrl.core.tools import (
    TOOL_ERROR_KINDS,
    TOOL_FORMATS,
    JsonToolFormat,
    PythonBlockFormat,
    Tool,
    ToolCall,
    ToolCallParseError,
    ToolError,
    ToolFormat,
    ToolResult,
    get_tool_format,
    run_tool_call,
)

__all__ = [
    "Agent",
    "SamplingParams",
    "ChatPrompt",
    "Prompt",
    "chat_messages",
    "prompt_key",
    "prompt_text",
    "Completion",
    "Feedback",
    "JointAction",
    "TurnRecord",
    "JointReward",
    "RewardBatch",
    "RewardFunctionError",
    "as_joint_reward",
    "check_reward_arity",
    "check_rewards",
    "ENTRY_POINT_GROUP",
    "Task",
    "TaskNotFoundError",
    "available_tasks",
    "get_task",
    "TOOL_ERROR_KINDS",
    "TOOL_FORMATS",
    "JsonToolFormat",
    "PythonBlockFormat",
    "Tool",
    "ToolCall",
    "ToolCallParseError",
    "ToolError",
    "ToolFormat",
    "ToolResult",
    "get_tool_format",
    "run_tool_call",
]
