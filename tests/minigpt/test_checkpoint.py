"""Checkpoints: save/load round trip (safetensors + card), and clear errors for missing or corrupt files."""

import json

import pytest
import torch

from minigpt.checkpoint import CheckpointError, load_card, load_model, save_checkpoint
from minigpt.model import GPT


@pytest.fixture
def saved(tmp_path, tiny_model):
    path = tmp_path / "tiny.safetensors"
    save_checkpoint(tiny_model, path, {"name": "tiny"})
    return path


def test_round_trip_in_storage_precision(saved, tiny_model):
    loaded = load_model(saved)
    tokens = torch.randint(0, tiny_model.config.vocab_size, (1, 8))
    expected = tiny_model.to(torch.bfloat16).float()(tokens)      # the file holds bfloat16 weights
    assert torch.allclose(loaded(tokens), expected, atol=1e-5)
    assert loaded.lm_head.weight is loaded.tok_emb.weight, "tied embeddings stay tied after loading"


def test_card_contents(saved, tiny_model):
    card = load_card(saved)
    assert card["name"] == "tiny" and card["parameters"] == tiny_model.num_parameters()
    assert card["config"] == tiny_model.config.to_dict() and len(card["sha256"]) == 64


def test_load_in_other_dtypes(saved):
    assert load_model(saved, dtype=torch.bfloat16).dtype == torch.bfloat16


def test_missing_weights(saved):
    saved.unlink()
    with pytest.raises(CheckpointError, match="not found"):
        load_model(saved)


def test_missing_card(tmp_path):
    with pytest.raises(CheckpointError, match="card .* not found"):
        load_model(tmp_path / "none.safetensors")


def test_corrupt_weights_fail_the_sha256_check(saved):
    data = bytearray(saved.read_bytes())
    data[-1] ^= 0xFF
    saved.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256"):
        load_model(saved)


def test_truncated_file_without_verification(saved):
    saved.write_bytes(saved.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        load_model(saved, verify=False)


def test_card_that_is_not_json(saved):
    saved.with_suffix(".json").write_text("{oops")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_model(saved)


def test_weights_that_do_not_fit_the_config(saved):
    card = json.loads(saved.with_suffix(".json").read_text())
    card["config"]["n_layers"] = 3
    saved.with_suffix(".json").write_text(json.dumps(card))
    with pytest.raises(CheckpointError, match="does not fit"):
        load_model(saved)


def test_no_pickle_in_checkpoints():
    from minigpt.paths import data_dir
    files = sorted((data_dir() / "checkpoints").glob("*"))
    assert not [f for f in files if f.suffix in {".pt", ".pth", ".bin", ".pkl", ".ckpt"}]


def test_training_is_seeded_and_repeats(tiny_config):
    """`make models` retrains the same weights: two short runs from the same seed agree exactly."""
    import dataclasses

    from minigpt.training.train import TrainConfig, train_model

    cfg = dataclasses.replace(tiny_config, vocab_size=4096)
    tc = TrainConfig(steps=3, batch_size=2, seq_len=16, warmup=1, eval_every=3, eval_windows=2)
    (a, _), (b, _) = train_model(cfg, tc, log=False), train_model(cfg, tc, log=False)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
