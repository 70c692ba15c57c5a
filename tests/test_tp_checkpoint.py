"""A checkpoint of a GPT trained at (dp=2, tp=2) loads in real MPI jobs at 1 rank (unsharded) and at
(dp=4, tp=1), model and AdamW state, and training continues with the same losses."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "_tp_ckpt_job.py")


def _launch(n, *args):
    cmd = [sys.executable, "-m", "hpcfsdp.cli.main", "launch", "-n", str(n), "--timeout", "120", "--",
           sys.executable, JOB, *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, f"{' '.join(args)} at {n} ranks failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"


@pytest.mark.timeout(400)
def test_tp_checkpoint_loads_at_1_rank_and_at_dp4(tmp_path):
    d = str(tmp_path)
    _launch(4, "save", d)
    want = json.load(open(os.path.join(d, "cont_save_4.json")))
    for n in (1, 4):
        _launch(n, "load", d)
        got = json.load(open(os.path.join(d, f"cont_load_{n}.json")))
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"continued at {n} ranks")
