"""Tool calling for the built-in real models, whose own chat templates do not render `tools`: their template
wrapped so that a request with tools gets a Hermes-style system turn (the tools as JSON in <tools></tools>, calls
asked for as <tool_call>{"name", "arguments"}</tool_call>, read back by `--tool-call-parser hermes`), assistant
tool calls and tool replies; without tools the model's own template renders, untouched."""

from __future__ import annotations

import json

# String content only (the models' templates take strings): the wrapped template keeps their content format.
_TOOLS_BRANCH = (
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0]['role'] == 'system' -%}{{- messages[0]['content'] -}}"
    "{%- else -%}{{- DEFAULT_SYSTEM -}}{%- endif -%}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided "
    "with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' -}}"
    "{%- for message in messages -%}"
    "{%- if not (loop.first and message['role'] == 'system') -%}"
    "{%- if message['role'] == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] -}}"
    "{%- for call in message['tool_calls'] or [] -%}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' + "
    "(call['function']['arguments'] | tojson) + '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def with_tools(template: str, default_system: str) -> str:
    """`template` (ChatML turns) rendering tools when a request has them; `default_system`: the system text the
    model's own template writes when the conversation has none."""
    branch = _TOOLS_BRANCH.replace("DEFAULT_SYSTEM", json.dumps(default_system))
    return "{%- if tools -%}" + branch + "{%- else -%}" + template + "{%- endif -%}"
