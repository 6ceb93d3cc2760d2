"""Issue 2, Python API: live ExportedPrograms bundle with the user's Dim names kept."""
import torch
from torch.export import Dim, export

from examples.translator import Decoder, Encoder
from registry import BundleFile, bundle_exported_programs


def test_live_programs_keep_dim_names_and_samples(tmp_path):
    batch, seq = Dim("batch", min=1, max=32), Dim("seq", min=2, max=16)
    tokens, mask = torch.randint(0, 100, (2, 8)), torch.ones(2, 9, dtype=torch.bool)
    enc_ds = {"tokens": {0: batch, 1: seq}, "mask": {0: batch, 1: seq + 1}}
    dec_ds = {"hidden": {0: batch, 1: seq}}
    enc = export(Encoder().eval(), (tokens, mask), dynamic_shapes=enc_ds)
    dec = export(Decoder().eval(), (torch.randn(2, 8, 8),), dynamic_shapes=dec_ds)
    result = bundle_exported_programs(tmp_path / "t.pt2b", {"encoder": enc, "decoder": dec},
                                      dynamic_shapes={"encoder": enc_ds, "decoder": dec_ds},
                                      samples={"encoder": [(tokens, mask)]}, metadata={"team": "nlp"})
    programs = BundleFile.open(result.path).manifest.programs
    tok, msk = programs["encoder"].inputs
    assert [d.dim for d in tok.shape] == ["batch", "seq"]
    assert msk.shape[1].dim == "seq + 1" and (msk.shape[1].min, msk.shape[1].max) == (3, 17)
    assert {c.dim for c in programs["encoder"].range_constraints} == {"batch", "seq", "seq + 1"}
    assert [d.dim for d in programs["decoder"].inputs[0].shape[:2]] == ["batch", "seq"]
    assert result.manifest.samples[0].program == "encoder"
    # a user's live program is not changed by bundling it
    assert enc.example_inputs is not None
