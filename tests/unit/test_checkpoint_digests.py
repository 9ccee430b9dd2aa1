"""artifacts/checkpoint_digests.py: manifests of checkpoint files, signed with the owner's key, and what
makes one fail to verify."""

from __future__ import annotations

import json
import stat
import subprocess

import pytest

from artifacts import checkpoint_digests as cd
from artifacts.file_hashes import sha256

KEY = b"k" * 32
FILES = {"step2/mp_rank_00_model_states.pt": "ab" * 32}


def test_a_manifest_verifies_under_its_key_run_folder_and_tag_only():
    text = cd.manifest(KEY, "run1", "work/checkpoints/policy", "step2", FILES)
    assert cd.verified_files(KEY, "run1", "work/checkpoints/policy", "step2", [text]) == FILES
    for key, run, folder, tag in ((b"x" * 32, "run1", "work/checkpoints/policy", "step2"),
                                  (KEY, "run2", "work/checkpoints/policy", "step2"),
                                  (KEY, "run1", "work/checkpoints/critic", "step2"),
                                  (KEY, "run1", "work/checkpoints/policy", "step3")):
        assert cd.verified_files(key, run, folder, tag, [text]) is None
    edited = json.loads(text)
    edited["files"]["step2/mp_rank_00_model_states.pt"] = "cd" * 32  # a digest changed to fit planted bytes
    assert cd.verified_files(KEY, "run1", "work/checkpoints/policy", "step2", [json.dumps(edited)]) is None
    assert cd.verified_files(KEY, "run1", "work/checkpoints/policy", "step2", ["not json", text]) is None
    assert cd.verified_files(KEY, "run1", "work/checkpoints/policy", "step2", []) is None


@pytest.mark.skipif(subprocess.run(["which", "openssl"], capture_output=True).returncode != 0, reason="no openssl")
def test_the_signature_is_hmac_sha256_as_openssl_computes_it():
    signed = json.dumps({"run": "r", "folder": "f", "tag": "t", "files": FILES}, sort_keys=True)
    done = subprocess.run(["openssl", "dgst", "-sha256", "-hmac", KEY.decode()], input=signed.encode(),
                          capture_output=True, check=True, timeout=30)
    assert cd.signature(KEY, "r", "f", "t", FILES) == done.stdout.decode().split()[-1]


def test_the_key_is_made_once_for_this_user_alone(tmp_path):
    key = cd.signing_key(tmp_path / "state")
    assert len(key) == 32 and cd.signing_key(tmp_path / "state") == key
    assert stat.S_IMODE((tmp_path / "state" / cd.KEY_FILE).stat().st_mode) == 0o600


def test_the_sha256_of_a_file(tmp_path):
    (tmp_path / "f").write_bytes(b"abc")  # FIPS 180-2's example
    assert sha256(tmp_path / "f") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
