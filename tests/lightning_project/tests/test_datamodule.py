"""The digits: the same from the same seed, split as asked, batched as asked."""

from __future__ import annotations

import pytest
import torch
from digits.data import DigitsDataModule


@pytest.mark.parametrize("batch_size", [32, 128])
def test_the_data_module_splits_and_batches(batch_size: int) -> None:
    data = DigitsDataModule(batch_size=batch_size)
    data.prepare_data()
    assert (data.data_train, data.data_val, data.data_test) == (None, None, None)
    data.setup("fit")
    splits = (data.data_train, data.data_val, data.data_test)
    assert [len(split) if split is not None else 0 for split in splits] == [700, 150, 150]

    images, labels = next(iter(data.train_dataloader()))
    assert images.shape == (batch_size, 1, 8, 8)
    assert images.dtype == torch.float32
    assert labels.shape == (batch_size,)
    assert labels.dtype == torch.int64
    assert int(labels.min()) >= 0
    assert int(labels.max()) < data.num_classes


def test_the_same_seed_gives_the_same_data_and_another_seed_other_data() -> None:
    def test_images(seed: int) -> torch.Tensor:
        data = DigitsDataModule(seed=seed)
        data.setup("test")
        images = next(iter(data.test_dataloader()))[0]
        assert isinstance(images, torch.Tensor)
        return images

    torch.testing.assert_close(test_images(3), test_images(3), rtol=0, atol=0)
    assert not torch.equal(test_images(3), test_images(4))


def test_a_split_that_is_not_the_whole_is_refused() -> None:
    with pytest.raises(ValueError, match=r"adds up to 900, not num_samples=1000"):
        DigitsDataModule(train_val_test_split=(700, 100, 100))
