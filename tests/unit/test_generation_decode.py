"""`generation.decode` returns the tokens HF `generate` returns for the same seed and settings, on the model
families users bring (a sliding window shorter than the rows, MoE), with log-probs equal to those of
`generate`'s raw logits."""

import pytest
import torch

from stages.common.generation import decode, left_padded, sampling_config
from stages.rl.losses import log_probs_from_logits
from tests.model_families import FAMILIES, SIZE

EOS, PAD = 3, 0


class Tok:  # what `sampling_config` reads of a tokenizer
    eos_token_id, pad_token_id = EOS, PAD


def model_of(family: str, eos_bias: float):
    """A random-init model of `family` whose head adds `eos_bias` to EOS's logit, so that rows end early."""
    spec = FAMILIES[family]
    config = spec.config_class(vocab_size=40, **SIZE, **spec.config, eos_token_id=EOS, pad_token_id=PAD)
    torch.manual_seed(0)
    model = spec.model_class(config).eval()
    head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[EOS] = eos_bias
    model.lm_head = head
    return model


def prompts(seed: int, n: int = 12) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, 40, (int(k),), generator=g).tolist() for k in torch.randint(3, 11, (n,), generator=g)]


def hf(model, input_ids, attention_mask, config):
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config,
                         return_dict_in_generate=True, output_logits=True)
    return out.sequences[:, input_ids.shape[1]:], torch.stack(out.logits, dim=1)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (None, 1.0)])
def test_decode_draws_what_hf_generate_draws(family, temperature, top_p):
    model = model_of(family, eos_bias=0.0 if temperature is None else 1.0)
    config = sampling_config(Tok, 24, temperature, top_p)
    input_ids, attention_mask = left_padded(prompts(1), PAD)
    torch.manual_seed(5)
    expected, logits = hf(model, input_ids, attention_mask, config)
    torch.manual_seed(5)
    got, log_probs = decode(model, input_ids, attention_mask, config, log_probs=True)
    assert torch.equal(got, expected)
    ended = (expected == EOS).long().cumsum(dim=1)
    drawn = (ended == 0) | ((ended == 1) & (expected == EOS))  # each row's tokens up to and including its EOS
    if temperature is not None:  # some rows end early (dropped from the batch), most after a few tokens
        assert 0 < (~drawn).sum() and drawn.sum() > 3 * len(drawn)
    expected_log_probs = log_probs_from_logits(logits, expected, temperature or 1.0)
    assert torch.allclose(log_probs[drawn], expected_log_probs[drawn], atol=1e-6)
    assert (log_probs[~drawn] == 0).all()


def test_rows_stop_at_eos_and_the_loop_ends_when_every_row_has():
    model = model_of("llama3", eos_bias=3.0)  # EOS drawn about a third of the time
    config = sampling_config(Tok, 64, 1.0)
    input_ids, attention_mask = left_padded(prompts(2, n=32), PAD)
    torch.manual_seed(0)
    new, log_probs = decode(model, input_ids, attention_mask, config, log_probs=True)
    ends = [row.index(EOS) for row in new.tolist()]
    assert new.shape[1] == max(ends) + 1 < 64 and min(ends) < max(ends)  # stopped once the last row ended
    for row, end in zip(new.tolist(), ends):
        assert row[end + 1:] == [PAD] * (len(row) - end - 1)
    assert torch.isfinite(log_probs).all() and (log_probs <= 0).all()
