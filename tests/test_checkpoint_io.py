"""Checkpoint writes are atomic and stay in the checkpoint folder."""

from __future__ import annotations

import pytest
import torch

from progpo.lit.callbacks import AtomicCheckpointIO


def test_a_write_that_fails_half_way_keeps_the_old_checkpoint_and_stages_only_beside_it(tmp_path, monkeypatch):
    path = tmp_path / "checkpoints" / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"step": 1}, path)
    assert torch.load(path, weights_only=False) == {"step": 1}

    def dying_save(obj, fh):  # a crash after part of the file is written
        fh.write(b"partial")
        raise OSError("disk went away")

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(OSError, match="disk went away"):
        io.save_checkpoint({"step": 2}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=False) == {"step": 1}  # the previous checkpoint is intact
    # the partial write was staged beside the target (IterationCheckpoint removes it at the next start),
    # not in the system temp directory where a killed write would stay
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt", "last.ckpt.tmp"]
    io.save_checkpoint({"step": 3}, path)
    assert torch.load(path, weights_only=False) == {"step": 3}
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt"]
