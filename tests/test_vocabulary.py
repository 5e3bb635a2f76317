"""One vocabulary (docs/glossary.md, issue 25): every renamed public name keeps working
for one release with a DeprecationWarning, and gives the same result as the new name."""

from __future__ import annotations

import json

import pytest

from pipeoffload.cli import main
from pipeoffload.costs import Costs, load_rank_costs, load_stage_costs, parse_costs
from pipeoffload.errors import ParameterError
from pipeoffload.ir import Placement

TRIPLES = ((1.0, 1.0, 1.0), (2.0, 2.0, 2.0))


# --- stage_costs -> rank_costs --------------------------------------------------------


def test_costs_stage_costs_keyword_warns_and_means_rank_costs():
    with pytest.warns(DeprecationWarning, match="stage_costs=...\\) is deprecated; call it rank_costs"):
        old = Costs(comm=0.5, stage_costs=TRIPLES)
    assert old == Costs(comm=0.5, rank_costs=TRIPLES)
    assert old.rank_costs == TRIPLES
    assert old.duration_table(Placement.loop(2)) == Costs(comm=0.5, rank_costs=TRIPLES).duration_table(
        Placement.loop(2))


def test_costs_stage_costs_attribute_warns():
    c = Costs(rank_costs=TRIPLES)
    with pytest.warns(DeprecationWarning, match="Costs.stage_costs is deprecated; use Costs.rank_costs"):
        assert c.stage_costs == TRIPLES


def test_costs_both_names_is_an_error_naming_rank_costs():
    with pytest.warns(DeprecationWarning), pytest.raises(ParameterError, match="^rank_costs: given twice"):
        Costs(rank_costs=TRIPLES, stage_costs=TRIPLES)


def test_rank_costs_errors_name_rank_costs():
    with pytest.raises(ParameterError, match="^rank_costs: gives 1 ranks' costs but the schedule has 2 ranks"):
        Costs(rank_costs=((1, 1, 1),)).check_fits(Placement.loop(2))
    with pytest.raises(ParameterError, match="^rank_costs: F must be a positive"):
        Costs(rank_costs=((0, 1, 1),))


def test_parse_costs_old_keyword_and_old_file_key_warn(tmp_path):
    new = parse_costs("comm=0.1", {"ranks": [list(t) for t in TRIPLES]})
    assert new == parse_costs("comm=0.1", [list(t) for t in TRIPLES])
    with pytest.warns(DeprecationWarning, match="parse_costs\\(stage_costs=...\\) is deprecated"):
        assert parse_costs("comm=0.1", stage_costs=[list(t) for t in TRIPLES]) == new
    with pytest.warns(DeprecationWarning, match="'stages' key is deprecated; call it 'ranks'"):
        assert parse_costs("comm=0.1", {"stages": [list(t) for t in TRIPLES]}) == new
    f = tmp_path / "r.json"
    f.write_text(json.dumps([list(t) for t in TRIPLES]))
    with pytest.warns(DeprecationWarning, match="load_stage_costs is deprecated; use load_rank_costs"):
        assert load_stage_costs(f) == load_rank_costs(f)
    with pytest.raises(ParameterError, match="^rank_costs: a JSON object needs a 'ranks' or 'layer_groups'"):
        parse_costs(None, {"per_rank": []})


def test_cli_stage_costs_flag_is_a_deprecated_rank_costs(tmp_path, capsys):
    f = tmp_path / "ranks.json"
    f.write_text(json.dumps([{"F": 1, "B": 1, "W": 1}] * 3 + [{"F": 2, "B": 2, "W": 2}]))
    argv = ["simulate", "1f1b", "-p", "4", "-m", "4", "--json"]
    assert main(argv + ["--rank-costs", str(f)]) == 0
    new = json.loads(capsys.readouterr().out)
    assert main(argv + ["--stage-costs", str(f)]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out) == new and new["busy"] == [12, 12, 12, 24]
    assert "--stage-costs is deprecated and will be removed; use --rank-costs" in out.err
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    help_text = capsys.readouterr().out
    assert "--rank-costs FILE" in help_text and "--stage-costs" not in help_text


# --- OffloadResult.chunks (C) -> offloaded_chunks; Schedule.chunks stays v ------------


def test_offload_result_chunks_is_a_deprecated_offloaded_chunks(capsys):
    from pipeoffload.passes.offload import plan_offload
    from pipeoffload.schedules import generate

    sched = generate("interleaved-1f1b", p=2, m=4, v=2)
    res = plan_offload(sched, offload_chunks=1)
    assert res.offloaded_chunks == 1 and res.schedule.chunks == sched.chunks == 2
    assert res.summary()["chunks"] == 1  # JSON key unchanged
    with pytest.warns(DeprecationWarning, match="OffloadResult.chunks is deprecated; use OffloadResult.offloaded"):
        assert res.chunks == 1
    assert main(["simulate", "interleaved-1f1b", "-p", "2", "-m", "4", "-v", "2", "--offload-chunks", "1",
                 "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["chunks"] == 2 and obj["offloaded_chunks"] == 1 and obj["offload"]["chunks"] == 1


# --- one recompute enum ---------------------------------------------------------------

from pipeoffload.recompute import RECOMPUTE_LEVELS, Recompute  # noqa: E402


@pytest.mark.parametrize("value, level", [
    (False, Recompute.NONE), (True, Recompute.ELEMENTWISE), ("none", Recompute.NONE),
    ("Elementwise", Recompute.ELEMENTWISE), (" selective ", Recompute.SELECTIVE), ("FULL", Recompute.FULL),
    (Recompute.FULL, Recompute.FULL),
])
def test_recompute_of_normalises_bools_and_names(value, level):
    assert Recompute.of(value) is level
    assert level == level.value and str(level) == level.value and f"{level}" == level.value
    assert bool(level) == (level is not Recompute.NONE)  # as the old False / True


@pytest.mark.parametrize("value", ["off", "partial", 1, None, 0.5, ["full"]])
def test_recompute_of_names_the_parameter_and_the_valid_values(value):
    with pytest.raises(ParameterError, match="^offload.recompute: must be one of none, elementwise, selective, "
                                             "full \\(or true = elementwise, false = none\\), got "):
        Recompute.of(value, "offload.recompute")


def test_model_spec_one_recompute_level():
    from pipeoffload.costmodel.presets import get_model

    m = get_model("1.5B")
    for level in RECOMPUTE_LEVELS:
        assert m.with_recompute(level).recompute_level is level
    assert m.replace(recompute="elementwise") == m.with_recompute(True) == m.replace(recompute_elementwise=True)
    assert m.replace(recompute="Full").layer() == m.with_recompute(Recompute.FULL).layer()
    assert json.loads(json.dumps(m.with_recompute("selective").summary()))["recompute"] == "selective"
    with pytest.raises(ParameterError, match="^recompute: must be one of none, elementwise"):
        m.replace(recompute="everything")


def test_plan_options_take_the_enum_bools_and_names():
    from pipeoffload.planner import PlanOptions

    old = PlanOptions(recompute=(False, True, "selective", "full"))
    assert old.recompute == RECOMPUTE_LEVELS == PlanOptions().recompute
    assert all(isinstance(rc, Recompute) for rc in old.recompute)
    with pytest.raises(ParameterError, match="^recompute: must be one of none, elementwise"):
        PlanOptions(recompute=(False, "partial")).check()
    with pytest.raises(ParameterError, match="^recompute: needs at least one of none, elementwise, selective, full"):
        PlanOptions(recompute=()).check()


def test_train_config_recompute_accepts_bools_and_runtime_levels_only():
    from pipeoffload.training.config import TrainConfig

    for val, level in ((True, Recompute.ELEMENTWISE), ("elementwise", Recompute.ELEMENTWISE), (False, Recompute.NONE),
                       ("none", Recompute.NONE)):
        assert TrainConfig.load(None, {"offload.recompute": val}).offload.recompute_level() is level
    cfg = TrainConfig.load(None, {"offload.recompute": "full"})
    with pytest.raises(ParameterError, match="^offload.recompute: the runtime recomputes elementwise outputs only"):
        cfg.check()
    with pytest.raises(ParameterError, match="^offload.recompute: must be one of none, elementwise"):
        TrainConfig.load(None, {"offload.recompute": "partial"}).offload.recompute_level()


# --- one model description: ModelConfig (the reference model) <-> ModelSpec (cost model) ---


def test_model_config_and_model_spec_derive_from_each_other():
    from pipeoffload.costmodel.presets import get_model
    from pipeoffload.models.config import ModelConfig

    cfg = ModelConfig(layers=6, hidden=96, heads=6, kv_heads=2, vocab_size=300, seq_len=40)
    spec = cfg.spec(microbatch=4)
    assert (spec.kv_groups, spec.seq, spec.vocab, spec.ffn, spec.microbatch) == (2, 40, 300, cfg.ffn_dim, 4)
    assert spec.params() == cfg.num_parameters()
    assert ModelConfig.from_spec(spec) == ModelConfig(**{**cfg.__dict__, "ffn": cfg.ffn_dim})
    assert cfg.spec(recompute=True).recompute_level is Recompute.ELEMENTWISE
    llama = get_model("tiny")
    back = ModelConfig.from_spec(llama)
    assert (back.kv_heads, back.seq_len, back.vocab_size, back.ffn_dim) == (llama.kv_groups, llama.seq, llama.vocab,
                                                                          llama.ffn)
    with pytest.raises(ParameterError, match="^model.heads"):
        ModelConfig.from_spec(llama.replace(hidden=30, heads=10))  # head dimension 3: odd, no rotary


# --- [offload]: the offload pass's names (OffloadOptions) -----------------------------


def test_offload_config_old_keys_warn_and_read_as_the_new(tmp_path):
    from pipeoffload.training.config import TrainConfig

    f = tmp_path / "old.toml"
    f.write_text('[offload]\nchunks = 1\ntime = 0.5\n')
    with pytest.warns(DeprecationWarning, match="offload.(chunks|time) is deprecated; call it offload.offload_"):
        old = TrainConfig.load(f)
    new = TrainConfig.load(None, {"offload.offload_chunks": 1, "offload.offload_time": 0.5})
    assert old == new and old.offload.options() == new.offload.options()
    assert new.offload.options().offload_chunks == 1 and new.offload.options().offload_time == 0.5
    assert TrainConfig.load(None, {"offload.chunks": 1}).offload.offload_chunks == 1  # an old override
    assert "offload_chunks = 1" in new.to_toml() and "\nchunks" not in new.to_toml()
    with pytest.warns(DeprecationWarning, match="offload.time is deprecated; call it offload.offload_time"):
        assert new.offload.time == 0.5
    with pytest.warns(DeprecationWarning, match="offload.chunks is deprecated"):
        new.offload.chunks = 2
    assert new.offload.offload_chunks == 2
    f.write_text('[offload]\nchunks = 1\noffload_chunks = 2\n')
    with pytest.raises(ParameterError, match="^offload.chunks: is the old name of offload.offload_chunks"):
        TrainConfig.load(f)


# --- scale(stages=) -> scale(ranks=): the study's x axis is the number of ranks p -----


def test_scale_stages_keyword_and_attributes_are_deprecated_ranks():
    from pipeoffload.studies.scale import scale

    new = scale("6.2B", "a100-80g", ranks=(4, 8), m=16, series=["1f1b"])
    with pytest.warns(DeprecationWarning, match="scale\\(stages=...\\) is deprecated; use scale\\(ranks=...\\)"):
        old = scale("6.2B", "a100-80g", stages=(4, 8), m=16, series=["1f1b"])
    assert old.to_dict() == new.to_dict() and new.to_dict()["stages"] == [4, 8]  # JSON keys unchanged
    with pytest.warns(DeprecationWarning, match="ScaleResult.stages is deprecated; use ScaleResult.ranks"):
        assert new.stages == new.ranks == (4, 8)
    with pytest.warns(DeprecationWarning, match="ScalePoint.stages is deprecated; use ScalePoint.ranks"):
        assert new.points["1f1b"][1].stages == 8
