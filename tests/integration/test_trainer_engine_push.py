"""Trainer -> CPU engine weight push over /update_weights_from_disk, end to end."""

from __future__ import annotations

import httpx
import torch
from numerics import assert_close_norm, forward_bound

from spade_async.trainer.batch import Batch, Sample
from spade_async.trainer.config import TrainerConfig
from spade_async.trainer.launch import TrainerProcess


def test_push_to_cpu_engine_reports_trainer_version(tiny_model, tmp_path):
    from spade_async.generation.server import make_engine_app, serve_in_thread
    from spade_async.models import load_causal_lm

    app = make_engine_app(str(tiny_model), context_length=64)
    cfg = TrainerConfig(model=str(tiny_model), lr=1e-2, start_timeout_s=120)
    batch = Batch(
        samples=[
            Sample(
                token_ids=[1, 5, 9, 13, 17],
                loss_mask=[0, 0, 1, 1, 1],
                advantage=a,
                rollout_logprobs=[0.0, 0.0, -10.8, -10.8, -10.8],
            )
            for a in (1.0, -1.0)
        ]
        + [
            Sample(
                token_ids=[1, 5, 9, 14, 18],
                loss_mask=[0, 0, 1, 1, 1],
                advantage=1.0,
                rollout_logprobs=[0.0, 0.0, -10.8, -10.8, -10.8],
            )
        ]
    )
    with serve_in_thread(app) as url, TrainerProcess(cfg, tiny_model, tmp_path / "run") as client:
        for _ in range(2):
            client.train_step(batch)
        pushed = client.push_weights([url], shm_dir=str(tmp_path / "shm"))
        assert pushed.version == 2 and pushed.engines == {url: "2"}
        assert httpx.get(f"{url}/model_info").json()["weight_version"] == "2"
        client.export_hf(str(tmp_path / "hf"))
        prompt = [1, 5, 9]
        out = httpx.post(
            f"{url}/generate",
            timeout=60,
            json={
                "input_ids": prompt,
                "return_logprob": True,
                "sampling_params": {"max_new_tokens": 3, "temperature": 1.0, "sampling_seed": 0},
            },
        ).json()
    assert out["meta_info"]["weight_version"] == "2"
    # the engine now serves exactly the trainer's weights: same log-probs as the export
    model, _ = load_causal_lm(str(tmp_path / "hf"))
    ids = torch.tensor([prompt + out["output_ids"]])
    with torch.no_grad():
        lp_TV = torch.log_softmax(model(ids).logits[0].float(), -1)
    want = [lp_TV[len(prompt) - 1 + i, t].item() for i, t in enumerate(out["output_ids"])]
    got = [row[0] for row in out["meta_info"]["output_token_logprobs"]]
    # same float32 weights, another kernel order (KV-cached decode vs one forward)
    rel = forward_bound(model.config, ids.shape[1])
    assert_close_norm(torch.tensor(got), torch.tensor(want, dtype=torch.float64), rel, "lp")
    initial, _ = load_causal_lm(str(tiny_model))
    with torch.no_grad():
        before_TV = torch.log_softmax(initial(ids).logits[0].float(), -1)
    # the push changed what it serves by far more than rounding
    assert (before_TV - lp_TV).double().norm() > 100 * rel * lp_TV.double().norm()
