"""Trainer: FSDP2 ranks under torchrun, packed micro-batches, fused log-prob + policy loss.

Controller-side API (never imports torch.distributed state into the controller):

    from spade_async.trainer.launch import TrainerProcess
    from spade_async.trainer.batch import Batch, Sample
    with TrainerProcess(TrainerConfig(...), model_dir, run_dir, nproc=2) as client:
        metrics = client.train_step(Batch(samples=[Sample(...), ...]))   # dict[str, float]
        pushed = client.push_weights(["http://127.0.0.1:30000"])          # .version, .engines
        client.save("runs/x/checkpoints/step-3", hf_directory="runs/x/hf")
        client.load("runs/x/checkpoints/step-3")

Modules: config (TrainerConfig), batch (wire structs + validation), packing, model
(PolicyModel, FSDP2), step (Trainer.train_step), checkpoint (DCP + HF export), weights
(push to engines), rpc (rank-0 server), client (TrainerClient / AsyncTrainerClient),
launch (TrainerProcess), main (rank entry point).
"""
