"""`splice chat`'s sampling flags become the client's keywords (and so the SamplingParams the server checks)."""

from __future__ import annotations

import pytest

from app.cli import build_parser, chat_sampling
from splice.sampling import SamplingParams


def _sampling(*flags: str) -> dict:
    return chat_sampling(build_parser().parse_args(["chat", "Hi", *flags]))


def test_defaults_send_only_temperature_and_max_tokens():
    assert _sampling() == {"temperature": 0.0, "max_tokens": 64}


def test_every_control_flag_reaches_sampling_params():
    got = _sampling("--seed", "3", "--top-p", "0.9", "--top-k", "5", "--presence-penalty", "0.5",
                    "--frequency-penalty", "-1", "--repetition-penalty", "1.2", "--min-p", "0.1", "--min-tokens", "4",
                    "--logit-bias", "50=-100", "--logit-bias", "7=2.5", "--bad-word", "red", "--bad-word", "blue",
                    "--stop", "END", "--include-stop-str", "--n", "3")
    p = SamplingParams(**got)
    assert (p.seed, p.top_p, p.top_k, p.presence_penalty, p.frequency_penalty, p.repetition_penalty, p.min_p,
            p.min_tokens) == (3, 0.9, 5, 0.5, -1.0, 1.2, 0.1, 4)
    assert p.logit_bias == ((7, 2.5), (50, -100.0)) and p.bad_words == ("red", "blue")
    assert p.stop == ("END",) and p.include_stop_str_in_output and p.n == 3


def test_a_malformed_logit_bias_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        _sampling("--logit-bias", "50:-1")
    assert exit_.value.code == 2 and "TOKEN_ID=BIAS" in capsys.readouterr().err
