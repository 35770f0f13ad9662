"""--data/--data-format/--prefetch: parsing, format detection and refusals before submitting (no Ray)."""
import json

import pytest
from click.testing import CliRunner

from raytrain.cli.main import main
from raytrain.cli.options import options_from_flags
from raytrain.config.data import parse_data_pairs, resolve_data
from raytrain.config.resolve import resolve
from raytrain.errors import ConfigError
from tests.conftest import JOBS

CNN = str(JOBS / "cnn.py")


@pytest.fixture
def files(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"id": 0}\n')
    (tmp_path / "b.parquet").write_bytes(b"PAR1")
    (tmp_path / "c.csv").write_text("id\n0\n")
    (tmp_path / "d.txt").write_text("hello\n")
    (tmp_path / "e.dat").write_text("?")
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "data-00000-of-00001.arrow").write_bytes(b"")
    (hf / "dataset_info.json").write_text("{}")
    shards = tmp_path / "shards"
    shards.mkdir()
    for i in range(3):
        (shards / f"part-{i}.jsonl").write_text('{"id": 0}\n')
    (shards / "_SUCCESS").write_text("")
    return tmp_path


def test_formats_come_from_the_extension_the_folder_or_the_flag(files):
    data = {"a": f"{files}/a.jsonl", "b": f"{files}/b.parquet", "c": f"{files}/c.csv", "d": f"{files}/d.txt",
            "hf": f"{files}/hf", "shards": f"{files}/shards", "glob": f"{files}/shards/*.jsonl",
            "s3": "s3://bucket/corpus/train.parquet"}
    got = {d["name"]: d["format"] for d in resolve_data(data, None)}
    assert got == {"a": "json", "b": "parquet", "c": "csv", "d": "text", "hf": "hf", "shards": "json",
                   "glob": "json", "s3": "parquet"}
    assert resolve_data({"x": f"{files}/e.dat"}, "csv") == [{"name": "x", "path": f"{files}/e.dat", "format": "csv"}]


@pytest.mark.parametrize("data, fmt, message, flag", [
    ({"train": "nope.jsonl"}, None, "--data train=nope.jsonl: no such file or folder", "--data"),
    ({"train": "{d}/e.dat"}, None, "unknown format (extensions .dat); give --data-format", "--data-format"),
    ({"train": "{d}"}, None, "ambiguous format (files of csv, json, parquet, text)", "--data-format"),
    ({"train": "{d}/none-*.jsonl"}, None, "no file matches the pattern", "--data"),
    ({"train": "gs://bucket/corpus"}, None, "cannot tell the format of a URI", "--data-format"),
    ({"train": "{d}/a.jsonl"}, "xml", "--data-format xml: use one of json, parquet, csv, text, hf", "--data-format"),
    ({}, "json", "--data-format needs --data NAME=PATH", "--data-format"),
    ({"a b": "{d}/a.jsonl"}, None, "name 'a b' must be a word", "--data"),
])
def test_bad_data_is_refused_naming_the_flag(files, data, fmt, message, flag):
    data = {k: v.format(d=files) for k, v in data.items()}
    with pytest.raises(ConfigError) as err:
        resolve_data(data, fmt)
    assert message in str(err.value) and err.value.flag == flag


def test_pairs_from_flags_and_profiles():
    assert parse_data_pairs(("train=a.jsonl", "eval=x=y.csv")) == {"train": "a.jsonl", "eval": "x=y.csv"}
    assert parse_data_pairs(("corpus.jsonl",)) == {"train": "corpus.jsonl"}
    assert parse_data_pairs({"train": "a"}) == {"train": "a"}
    with pytest.raises(ConfigError, match="dataset 'train' given twice"):
        parse_data_pairs(("a.jsonl", "train=b.jsonl"))


def test_the_plan_carries_the_datasets_and_prefetch(files, tmp_path):
    plan = resolve(options_from_flags(CNN, (), data=(f"train={files}/a.jsonl",), prefetch=4))
    assert plan.data == [{"name": "train", "path": f"{files}/a.jsonl", "format": "json"}] and plan.prefetch == 4
    assert resolve(options_from_flags(CNN, ())).prefetch == 2 and resolve(options_from_flags(CNN, ())).data == []
    profile = tmp_path / "p.yaml"
    profile.write_text(f"data:\n  train: {files}/a.jsonl\n  eval: {files}/c.csv\nprefetch: 0\n")
    plan = resolve(options_from_flags(CNN, (), config=str(profile), data=(f"eval={files}/d.txt",)))
    assert {d["name"]: d["format"] for d in plan.data} == {"train": "json", "eval": "text"} and plan.prefetch == 0
    with pytest.raises(ConfigError, match="--prefetch -1: must be an integer >= 0"):
        resolve(options_from_flags(CNN, (), prefetch=-1))


def test_dry_run_shows_the_datasets_and_where_preprocessing_runs(files, raytrain_home):
    args = ["submit", CNN, "--dry-run", "--data", f"train={files}/a.jsonl", "--data", f"eval={files}/hf"]
    out = CliRunner().invoke(main, args).output
    assert f"data        train: {files}/a.jsonl (json)" in out and f"eval: {files}/hf (hf)" in out
    assert "preprocess: read as Ray Data tasks on the cluster's CPUs" in out  # CNN defines no preprocess
    assert "run once per job by a feeder actor" in out
    assert "streaming: the workers start once 1 row(s) (one micro-batch per data-parallel rank) are ready" in out
    assert "workers: each of 1 data-parallel rank(s) reads only its own share of the blocks" in out and "prefetch 2 batch(es)" in out
    info = json.loads(CliRunner().invoke(main, [*args, "--json"]).output)
    assert info["data"]["datasets"][1] == {"name": "eval", "path": f"{files}/hf", "format": "hf"}
    assert info["data"]["preprocess"] is False and info["data"]["prefetch"] == 2
    off = CliRunner().invoke(main, [*args, "--prefetch", "0", "--workers", "2", "--micro-batch", "3"]).output
    assert "the workers start once 6 row(s)" in off and "each of 2 data-parallel rank(s)" in off
    assert "prefetch 0 batch(es) ahead: off" in off
    refused = CliRunner().invoke(main, ["submit", CNN, "--data", "train=/nowhere/x.jsonl"])
    assert refused.exit_code == 2 and "--data train=/nowhere/x.jsonl: no such file or folder" in refused.output


def test_dry_run_says_how_many_rows_and_bytes_each_rank_reads_per_epoch(tmp_path, raytrain_home):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": list(range(1000)), "v": [float(i) for i in range(1000)]})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=100)
    (tmp_path / "l.jsonl").write_text("".join(f'{{"id": {i}}}\n' for i in range(10)))
    args = ["submit", CNN, "--dry-run", "--workers", "2", "--data", f"train={tmp_path}/t.parquet",
            "--data", f"eval={tmp_path}/l.jsonl", "--data", "more=s3://bucket/x.parquet"]
    out = CliRunner().invoke(main, args).output
    footer = pq.ParquetFile(tmp_path / "t.parquet").metadata
    size = sum(footer.row_group(i).total_byte_size for i in range(footer.num_row_groups))
    assert "per rank: train: each of 2 rank(s) reads ~500 of 1,000 rows" in out, out
    assert "(from Parquet footers (bytes: uncompressed); rows before the job's preprocess)" in out
    assert "per rank: eval: each of 2 rank(s) reads ~5 of 10 rows, ~50 B of 100 B per epoch (from line counts" in out
    assert "per rank: more: rows and bytes per rank unknown before the job reads it (a URI: read on the cluster)" in out
    reads = json.loads(CliRunner().invoke(main, [*args, "--json"]).output)["data"]["read_per_rank"]
    assert reads[0]["rows"] == 1000 and reads[0]["bytes"] == size and reads[0]["bytes_per_rank"] == -(-size // 2)
    assert reads[1]["rows_per_rank"] == 5 and reads[2]["rows"] is None


def test_dry_run_names_the_jobs_preprocess(files, raytrain_home):
    job = str(JOBS / "gpt_text.py")
    out = CliRunner().invoke(main, ["submit", job, "--dry-run", "--json", "--data", f"train={files}/a.jsonl"]).output
    data = json.loads(out)["data"]
    assert data["preprocess"] is True
    assert data["preprocess_where"].startswith("read + the job's preprocess(dataset, ctx) as Ray Data tasks")


def test_defines_preprocess_reads_the_top_level_only(tmp_path):
    from raytrain.config.data import defines_preprocess

    job = tmp_path / "job.py"
    job.write_text("def train(ctx):\n    def preprocess(d, c):\n        return d\n")
    assert not defines_preprocess(str(job))
    job.write_text("import x\n\ndef preprocess(dataset, ctx):\n    return dataset\n")
    assert defines_preprocess(str(job)) and not defines_preprocess(str(tmp_path / "missing.py"))
