"""The per-user folders under the shared temp folder: made 0700, refused when the name is a link, another
user's, or open to others (each one line naming the folder)."""

from __future__ import annotations

import os
import stat

import pytest

from artifacts import private_dirs
from configs.errors import PipelineError

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def temp(tmp_path, monkeypatch):
    monkeypatch.setattr(private_dirs.tempfile, "gettempdir", lambda: str(tmp_path))
    return tmp_path


def test_a_new_folder_is_this_users_alone(temp):
    path = private_dirs.private_dir("rlhf-node")
    assert path == temp / f"rlhf-node-{os.getuid()}"
    assert stat.S_IMODE(path.stat().st_mode) == 0o700 and path.stat().st_uid == os.getuid()
    assert private_dirs.private_dir("rlhf-node") == path  # found again


def test_a_folder_open_to_others_is_refused(temp):
    path = temp / f"rlhf-node-{os.getuid()}"
    path.mkdir()
    path.chmod(0o777)
    with pytest.raises(PipelineError, match=rf"^{path}: open to other users \(mode 777\); chmod 700 it or remove it"):
        private_dirs.private_dir("rlhf-node")


def test_a_link_planted_under_the_name_is_refused(temp):
    target = temp / "elsewhere"
    target.mkdir(mode=0o700)
    (temp / f"rlhf-node-{os.getuid()}").symlink_to(target)
    with pytest.raises(PipelineError, match=r": not a folder of this user's own \(a link or a file\); remove it"):
        private_dirs.private_dir("rlhf-node")


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user needs root")
def test_another_users_folder_is_refused(temp):
    path = temp / f"rlhf-node-{os.getuid()}"
    path.mkdir(mode=0o700)
    os.chown(path, 65534, 65534)  # nobody
    with pytest.raises(PipelineError, match=rf"^{path}: owned by user id 65534, not this user \(0\); another user"):
        private_dirs.private_dir("rlhf-node")
