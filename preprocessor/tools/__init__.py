"""Tool calling (vLLM's `tools`, `tool_choice`, `parallel_tool_calls`): the request's checks (request.py), the
constraint `required` and a named choice imply (choice.py), the parsers that find calls in a finished answer
(parsers/), and the answer's tool_calls, whole or streamed (answer.py)."""
