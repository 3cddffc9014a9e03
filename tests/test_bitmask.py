"""engines/bitmask.apply writes what xgrammar's own apply writes, for one row
and for chosen rows of a batch, whatever the widths."""

from __future__ import annotations

import pytest
import torch
import xgrammar

from service.engines import bitmask


@pytest.mark.parametrize("vocab,logits_width", [(8101, 8101), (8101, 8192), (64, 60), (33, 33)])
def test_one_row_and_chosen_rows_match_xgrammar(vocab, logits_width):
    generator = torch.Generator().manual_seed(vocab + logits_width)
    mask = xgrammar.allocate_token_bitmask(4, vocab)
    mask.copy_(torch.randint(-2**31, 2**31 - 1, mask.shape, generator=generator,
                             dtype=torch.int64).to(torch.int32))
    logits = torch.randn(4, logits_width, generator=generator)
    for indices in (None, [0, 2], [3]):
        ours, theirs = logits.clone(), logits.clone()
        bitmask.apply(ours, mask, indices=indices)
        xgrammar.apply_token_bitmask_inplace(theirs, mask, indices=indices)
        assert torch.equal(ours, theirs)
        assert bool(torch.isinf(ours).any()) and bool(torch.isfinite(ours).any())
    row, row_theirs = logits[1].clone(), logits[1].clone()
    bitmask.apply(row, mask[1:2])
    as_numpy = logits[1].clone()
    bitmask.apply_row(as_numpy.numpy(), bitmask.bytes_of(mask[1:2].clone()))
    assert torch.equal(as_numpy, row)
    xgrammar.apply_token_bitmask_inplace(row_theirs, mask[1:2])
    assert torch.equal(row, row_theirs)
