"""A causal LM's checkpoint loaded under a scalar head (reward model, critic) says nothing of the LM head
it drops and the head it adds: transformers' load report is meant for surprises, and this is not one."""

import logging

from configs.schema import ModelConfig
from stages.rm.stage import load_reward_backbone
from tests.tiny_checkpoint import save_tiny_checkpoint


def test_the_reward_backbone_loads_without_transformers_load_report(tmp_path, caplog):
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    path = save_tiny_checkpoint(["Compute 1+2", "Answer: 3"], tmp_path / "lm")
    before = hf_logging.get_verbosity()
    with caplog.at_level(logging.WARNING):
        model = load_reward_backbone(path, ModelConfig())
        assert model.config.num_labels == 1 and model.score.weight.shape[0] == 1
        assert "LOAD REPORT" not in caplog.text
        assert hf_logging.get_verbosity() == before  # quiet for the load only
        AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)  # the same load, not quieted
        assert "LOAD REPORT" in caplog.text  # the report this test is about
