"""The embedded server's model path is checked in the runner before any server launches (and by the dry run): a
missing .gguf, random bytes named .gguf, a GGUF file cut short, an hf: name that is not shipped, an unknown
preset: exit 2 naming the path and what is wrong, where each once started both servers and failed them with
"server exited before it was ready"."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf_files import tiny_gguf

from harness.backends.llamacpp import model_file as llamacpp_model_file
from harness.models.check import check_gguf, check_model_path, model_path_of
from harness.models.files import ModelFileError
from harness.validation import ConfigError


def cut(tmp_path: Path) -> Path:
    whole = tiny_gguf(tmp_path / "whole.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(whole[: len(whole) // 2])
    return tmp_path / "cut.gguf"


def header_alone(tmp_path: Path) -> Path:
    """The first 24 bytes: magic, version and both counts (`head -c 24`)."""
    (tmp_path / "head.gguf").write_bytes(tiny_gguf(tmp_path / "whole.gguf").read_bytes()[:24])
    return tmp_path / "head.gguf"


def random_bytes(tmp_path: Path) -> Path:
    path = tmp_path / "random.gguf"
    path.write_bytes(np.random.default_rng(0).bytes(1 << 20))
    return path


CASES = {
    "missing": (lambda tmp: tmp / "missing.gguf", "missing.gguf: no such file"),
    "random bytes": (random_bytes, "random.gguf: not a GGUF file (it starts with bytes"),
    "cut short": (
        cut,
        "cut.gguf: a GGUF file that is not whole: the file has 4288 bytes but its 2 tensors end at byte 8548",
    ),
    "header alone": (header_alone, "head.gguf: a GGUF file that is not whole: the file ends at byte 24"),
    "unshipped hf: name": (
        lambda tmp: "hf:no-such-model",
        "'hf:no-such-model' is not a model the embedded server ships; valid: hf:smollm2-135m-instruct, hf:gemma3-270m",
    ),
    "unknown preset": (lambda tmp: "embedded:nope", "'embedded:nope' is not an embedded model"),
    "a folder without config.json": (lambda tmp: tmp, "not an embedded preset (embedded:small, ...), a shipped model"),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dry", [True, False])
def test_a_model_the_server_could_not_load_is_refused_before_any_launch(run_bench, tmp_path, case, dry):
    make, says = CASES[case]
    model = make(tmp_path)
    proc = run_bench(
        "experiment=real_block_vs_token",
        f"server.model_path={model}",
        f"dry_run={str(dry).lower()}",
        "campaign=refused",
    )
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, out[-2000:]
    assert says in out and "nothing was launched" in out and "Traceback" not in out, out[-2000:]
    assert "server exited" not in out and not (tmp_path / "real_block_vs_token").exists()  # no campaign, no server


def test_a_whole_gguf_file_and_the_shipped_names_pass(tmp_path):
    check_gguf(tiny_gguf(tmp_path / "ok.gguf"))
    check_model_path("ok.gguf", cwd=tmp_path)  # relative to the server's working directory
    check_model_path("embedded:mini")
    check_model_path("hf:gemma3-270m", python="/some/other/python")  # its packages are that interpreter's to have
    with pytest.raises(ModelFileError, match="no such file"):
        check_model_path("ok.gguf")  # (not in this process's working directory)


@pytest.mark.parametrize("make", [cut, header_alone])
def test_llama_server_is_not_given_a_gguf_file_cut_short(tmp_path, make):
    model = make(tmp_path)
    with pytest.raises(ConfigError, match=f"server.model_path={model}: .*{model.name}: a GGUF file that is not whole"):
        llamacpp_model_file(str(model))
    assert llamacpp_model_file(str(tmp_path / "whole.gguf")) == str(tmp_path / "whole.gguf")


def test_the_last_model_path_of_a_command_counts():
    assert model_path_of(["py", "-m", "harness.engine", "--model-path", "a", "--x", "--model-path=b"]) == "b"
    assert model_path_of(["py", "-m", "harness.engine"]) is None
