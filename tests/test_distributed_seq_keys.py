"""The key bookkeeping of refbraid.distributed.chained (no MPI): an encoder–decoder's
parameters and optimizer state split into blocks and back, and which keys are layer rows."""

import numpy as np

from refbraid.distributed.chained import _block, _is_rows, _prefixed, _split_key


def test_keys_split_into_blocks_and_back():
    state = {"encoder.opening.W": 1, "encoder.steps.Wq": 2, "decoder.closing.b": 3,
             "m/encoder.steps.Wq": 4, "v/decoder.steps.memory": 5}
    assert _split_key("m/encoder.steps.Wq") == ("encoder", "m/steps.Wq")
    enc, dec = _block(state, "encoder"), _block(state, "decoder")
    assert enc == {"opening.W": 1, "steps.Wq": 2, "m/steps.Wq": 4}
    assert dec == {"closing.b": 3, "v/steps.memory": 5}
    assert {**_prefixed(enc, "encoder"), **_prefixed(dec, "decoder")} == state
    assert _block({"step": np.int64(3)}, "encoder") == {}  # the optimizer's step counter


def test_layer_rows_are_the_steps_of_either_block():
    rows = [k for k in ("encoder.steps.W", "m/decoder.steps.W", "decoder.opening.W", "step",
                        "encoder.closing.steps") if _is_rows(k)]
    assert rows == ["encoder.steps.W", "m/decoder.steps.W"]
