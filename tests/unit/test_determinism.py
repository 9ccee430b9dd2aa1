"""infra.deterministic's process settings (stages/common/determinism.py). MKL reads its mode once per process, so
each case that depends on what a process did first runs in a fresh interpreter without MKL_CBWR."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from stages.common import determinism

STRICT_AUTO = 0x10002  # mkl_cbwr.h: MKL_CBWR_AUTO (2) | MKL_CBWR_STRICT (0x10000)


def fresh_process(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in determinism.ENV}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_mode_exports_mkls_cuBLAS_and_flash_attns_settings_and_keeps_the_users():
    assert determinism.env(False) == {}
    assert determinism.env(True) == {"MKL_CBWR": "AUTO,STRICT", "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
                                     "FLASH_ATTENTION_DETERMINISTIC": "1"}
    done = fresh_process("""
        import os
        os.environ["MKL_CBWR"] = "AVX2"
        from stages.common import determinism
        determinism.export_env(True)
        print(os.environ["MKL_CBWR"], os.environ["CUBLAS_WORKSPACE_CONFIG"])
    """)
    assert done.stdout.split() == ["AVX2", ":4096:8"], done.stderr


@pytest.mark.skipif(determinism.mkl_library() is None, reason="this torch has no MKL")
def test_apply_sets_mkls_reproducible_mode_in_a_process_that_has_not_computed():
    done = fresh_process("""
        import torch
        from stages.common import determinism
        determinism.apply(True)
        (torch.ones(64, 64) @ torch.ones(64, 64)).sum()
        print(determinism.mkl_library().mkl_serv_cbwr_get(-1), torch.are_deterministic_algorithms_enabled())
    """)
    assert done.stdout.split() == [str(STRICT_AUTO), "True"], done.stderr


@pytest.mark.skipif(determinism.mkl_library() is None, reason="this torch has no MKL")
def test_a_process_whose_mkl_computed_without_the_mode_is_one_line_naming_it():
    done = fresh_process("""
        import os, torch
        from stages.common import determinism
        (torch.ones(64, 64) @ torch.ones(64, 64)).sum()
        try:
            determinism.apply(True)
        except determinism.NotReproducible as e:
            print(os.getpid(), "|", e)
    """)
    pid, message = done.stdout.strip().split(" | ")
    assert message == (f"infra.deterministic: MKL has already computed in this process (pid {pid}) without MKL_CBWR; "
                       "start it with MKL_CBWR=AUTO,STRICT in its environment"), done.stderr


def test_off_turns_torchs_deterministic_algorithms_back_off():
    done = fresh_process("""
        import torch
        from stages.common import determinism
        determinism.apply(True)
        determinism.apply(False)
        print(torch.are_deterministic_algorithms_enabled(), torch.backends.mkldnn.deterministic)
    """)
    assert done.stdout.split() == ["False", "False"], done.stderr
