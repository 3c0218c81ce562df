"""`splice up`'s and `splice chat`'s flags, one declaration each, in tables by the groups docs/operations.md gives
them (the services' own: engine/cli.py and preprocessor/cli.py)."""

from __future__ import annotations

import argparse

from app.real_model import REAL_MODELS
from app.tiny.names import DEFAULT_MODEL, TINY_NAMES
from preprocessor.template_args import REASONING_EFFORTS
from preprocessor.tools.parsers import parser_names
from splice.flags import flag, json_flag
from splice.security import API_KEY_ENV, ENGINE_KEY_ENV

REAL_DEFAULT = next(iter(REAL_MODELS))
MODEL_HELP = (f"a built-in tiny model {sorted(TINY_NAMES)}, the built-in real model {REAL_DEFAULT}, a local HF "
              f"folder, or an HF id")


def logit_bias(text: str) -> tuple[int, float]:
    try:
        token, bias = text.split("=")
        return int(token), float(bias)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected TOKEN_ID=BIAS (e.g. 50256=-100), got {text!r}") from None


def token_ids(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected token IDs separated by commas (e.g. 5,17,42), got {text!r}") \
            from None


def tool_choice(text: str) -> str | dict:
    """--tool-choice: a mode, or any other word as the function's name (OpenAI's named choice)."""
    if text in ("none", "auto", "required"):
        return text
    return {"type": "function", "function": {"name": text}}


# --- splice up (the LoRA flags: app/lora_flags.py) ---------------------------------------------------------------

UP_ADDRESSES = (  # the model, and where the two services listen
    flag("--model", default=DEFAULT_MODEL, help=MODEL_HELP),
    flag("--host", default="127.0.0.1", help="the preprocessor's (public API's) listen address (0.0.0.0: all "
                                             "interfaces); the engine's is --engine-host"),
    flag("--port", type=int, default=50051, help="preprocessor (public API) port"),
    flag("--engine-host", default="127.0.0.1", help="the engine's listen address (loopback: only this host reaches "
                                                    "it)"),
    flag("--engine-port", type=int, default=50061, help="the engine's port"),
    flag("--http-port", type=int, default=8000, help="OpenAI-compatible HTTP API port (0: a free one)"),
)

UP_SECURITY = (  # keys and TLS on both hops
    flag("--api-key", default=None, help="require 'authorization: Bearer KEY' on the public API, gRPC and HTTP "
                                         f"(default: ${API_KEY_ENV})"),
    flag("--engine-api-key", default=None, help="a key the engine requires from the preprocessor "
                                                f"(default: ${ENGINE_KEY_ENV}; with a public key and none given, a "
                                                f"generated one)"),
    flag("--tls-cert", default=None, help="PEM certificate: the public API (gRPC and HTTP) serves TLS"),
    flag("--tls-key", default=None, help="PEM private key of --tls-cert"),
    flag("--tls-ca", default=None, help="PEM CA: the public API requires client certificates signed by it (mTLS)"),
    flag("--engine-server-cert", default=None, help="PEM certificate: the engine serves TLS (with "
                                                    "--engine-server-key and --engine-tls-ca)"),
    flag("--engine-server-key", default=None, help="PEM private key of --engine-server-cert"),
    flag("--engine-tls-ca", default=None, help="PEM CA the preprocessor trusts for the engine's certificate "
                                               "('system': the system's roots); with --engine-tls-cert the engine also "
                                               "requires the preprocessor's certificate signed by it (mTLS)"),
    flag("--engine-tls-cert", default=None, help="the preprocessor's client certificate for the engine (mTLS on the "
                                                 "engine link; with --engine-tls-key)"),
    flag("--engine-tls-key", default=None, help="PEM private key of --engine-tls-cert"),
)

UP_SERVING = (  # the preprocessor's serving flags that `splice up` takes itself
    flag("--allowed-media-domains", nargs="*", default=[], metavar="HOST[:PORT]",
         help="hosts and ports whose http(s) image URLs the HTTP API may fetch (a bare HOST: ports 80 and 443 only)"),
    flag("--enable-mm-embeds", action="store_true",
         help="accept image_embeds content parts (precomputed image features), as vLLM's flag"),
    flag("--tool-call-parser", choices=parser_names(), default=None,
         help="how calls are read from an answer to a request with tools (vLLM's parsers)"),
    flag("--enable-auto-tool-choice", action="store_true",
         help='serve tool_choice "auto" (the default with tools); needs --tool-call-parser'),
    flag("--served-model-name", nargs="+", default=None, metavar="NAME",
         help="the names the HTTP API serves the model as (vLLM's; default: --model as given)"),
)

UP_PASSED_ON = (  # any other flag of either service
    flag("--engine-args", default="", metavar="'FLAGS'",
         help="more `splice engine` flags, one quoted string, e.g. '--max-running-seqs 8'"),
    flag("--preprocessor-args", default="", metavar="'FLAGS'",
         help="more `splice preprocessor` flags, e.g. '--trust-request-chat-template'"),
)

UP_OUTPUT = (flag("--quiet", action="store_true", help="do not relay the services' logs (load progress)"),)

# --- splice chat ---------------------------------------------------------------------------------------------------

CHAT_MESSAGES = (  # what is sent, and to which preprocessor
    flag("prompt", help="user text (sent after any --embeds and --image parts)"),
    flag("--target", default="127.0.0.1:50051", help="preprocessor HOST:PORT"),
    flag("--system", default=None, help="a system message sent first"),
    flag("--lora", default=None, metavar="NAME", help="answer with the LoRA adapter served as NAME"),
    flag("--image", action="append", metavar="PATH", help="image file (repeatable)"),
    flag("--embeds", action="append", metavar="FILE.safetensors",
         help="prompt embeddings [n, hidden], one tensor per file (repeatable)"),
)

CHAT_SAMPLING = (  # the sampling controls, under vLLM's names
    flag("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)"),
    flag("--max-tokens", type=int, default=64, help="tokens to generate at most"),
    flag("--seed", type=int, default=None, help="sampling seed, for a repeatable sampled answer"),
    flag("--n", type=int, default=None, help="answers to sample from the one prompt (prefilled once), printed one "
                                             "after the other; with --seed, answer i samples with seed + i"),
    flag("--top-p", type=float, default=None, help="(0, 1]; nucleus sampling"),
    flag("--top-k", type=int, default=None, help="sample among the k most likely tokens (0: all)"),
    flag("--presence-penalty", type=float, default=None, help="[-2, 2]; per token generated so far"),
    flag("--frequency-penalty", type=float, default=None, help="[-2, 2]; per time a token was generated"),
    flag("--repetition-penalty", type=float, default=None, help="> 0; over prompt and answer tokens"),
    flag("--min-p", type=float, default=None, help="[0, 1]; relative to the most likely token"),
    flag("--min-tokens", type=int, default=None, help="no EOS or stop before this many tokens"),
    flag("--logit-bias", action="append", type=logit_bias, metavar="TOKEN_ID=BIAS",
         help="add BIAS in [-100, 100] to a token's logit (repeatable)"),
    flag("--allowed-token-ids", type=token_ids, metavar="ID,ID,...", help="only these tokens may be generated"),
    flag("--bad-words", action="append", metavar="WORD", help="a word never generated (repeatable)"),
    flag("--stop", action="append", metavar="TEXT", help="a stop string (repeatable)"),
    flag("--stop-token-ids", type=token_ids, metavar="ID,ID,...",
         help="tokens that end the answer, besides the model's EOS"),
    flag("--include-stop-str-in-output", action="store_true", help="keep the matched stop string in the answer"),
    flag("--ignore-eos", action="store_true", help="keep generating past the model's EOS"),
    flag("--skip-special-tokens", action=argparse.BooleanOptionalAction, default=True,
         help="drop special tokens from the answer's text"),
)

CHAT_LOGPROBS = (  # printed on stderr after the answer
    flag("--logprobs", action="store_true",
         help="print each answer token's ID and log-probability after the answer (on stderr)"),
    flag("--top-logprobs", type=int, default=None, metavar="N",
         help="[0, 20]; also the N most likely tokens at each step (implies --logprobs)"),
    flag("--logprob-token-ids", type=token_ids, metavar="ID,ID,...",
         help="at each step the log-probabilities of exactly these tokens, instead of the most likely (implies "
              "--logprobs)"),
    flag("--prompt-logprobs", type=int, default=None, metavar="N",
         help="[0, 20]; print each prompt token's log-probability and rank, and the N most likely tokens at each "
              "prompt position (on stderr)"),
)

CHAT_CONSTRAINTS = (  # the prefix cache's salt, structured outputs
    flag("--cache-salt", default=None, metavar="SALT",
         help="vLLM's cache_salt: cached prompt prefixes are reused only between requests with the same salt "
              "(1..256 characters)"),
    flag("--structured-outputs", type=json_flag(dict), metavar="JSON",
         help="""the answer follows a constraint (vLLM's structured_outputs): one of json (a schema), regex, """
              """choice, grammar (EBNF), json_object, structural_tag, e.g. '{"choice": ["yes", "no"]}'"""),
    flag("--response-format", type=json_flag(dict), metavar="JSON",
         help="""OpenAI's response_format, e.g. '{"type": "json_schema", "json_schema": {"name": "a", "schema": """
              """{...}}}' or '{"type": "json_object"}'"""),
)

CHAT_FIELDS = (  # vLLM's chat fields: the conversation's last turn, the template's arguments, tools
    flag("--assistant", default=None, metavar="TEXT",
         help="an assistant message sent after the prompt (with --continue-final-message: the answer's start)"),
    flag("--continue-final-message", action="store_true",
         help="the answer continues the last message instead of starting a new turn (no generation prompt)"),
    flag("--add-special-tokens", action="store_true",
         help="add the tokenizer's special tokens (BOS) on top of the chat template's"),
    flag("--documents", type=json_flag(list), metavar="JSON",
         help='documents for a RAG template, e.g. \'[{"title": "...", "text": "..."}]\''),
    flag("--reasoning-effort", choices=REASONING_EFFORTS,
         help="passed to the chat template (with enable_thinking: not 'none')"),
    flag("--chat-template-kwargs", type=json_flag(dict), metavar="JSON",
         help="""extra chat template variables, e.g. '{"enable_thinking": false}'"""),
    flag("--mm-processor-kwargs", type=json_flag(dict), metavar="JSON",
         help="""image processor arguments the model takes, e.g. '{"max_pixels": 200704}'"""),
    flag("--tools", type=json_flag(list), metavar="JSON",
         help="""OpenAI's tools, e.g. '[{"type": "function", "function": {"name": "get_weather", "parameters": """
              """{...}}}]'; calls found are printed after the answer"""),
    flag("--tool-choice", type=tool_choice, metavar="none|auto|required|NAME",
         help="with --tools: none, auto (the server's default with tools), required, or a function's name"),
    flag("--parallel-tool-calls", action=argparse.BooleanOptionalAction, default=None,
         help="--no-parallel-tool-calls: only the first call"),
)

CHAT_CONNECTION = (  # the client's
    flag("--timeout", type=float, default=300.0, help="seconds the whole answer may take"),
    flag("--tls", action="store_true", help="connect over TLS, trusting the system's roots"),
    flag("--tls-ca", default=None, help="connect over TLS, trusting this PEM CA"),
    flag("--tls-cert", default=None, help="client certificate for a server that requires one (mTLS)"),
    flag("--tls-key", default=None, help="PEM private key of --tls-cert"),
    flag("--api-key", default=None, help="the server's key (default: $SPLICE_API_KEY)"),
)

# --- splice demo, splice build-tiny --------------------------------------------------------------------------------

DEMO = (
    flag("--model", default=DEFAULT_MODEL, help=MODEL_HELP),
    flag("--max-tokens", type=int, default=24, help="tokens each answer generates at most"),
    flag("--real-model", default=REAL_DEFAULT, help="then ask this model a question whose tail is sent as prompt "
                                                    "embeddings ('' skips it)"),
)

BUILD_TINY = (flag("names", nargs="*", help="which to build (default: all)"),)
