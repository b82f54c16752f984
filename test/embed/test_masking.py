"""spkflow.embed.masking on small torch encoders made here: what PaddingMask accepts and refuses (naming
the layer), that a padded batch through strided / dilated / pooled layers (1-D and 2-D, time first or
last) equals each utterance alone, and that garbage in padded frames (inf, nan) never reaches a valid
frame.  The toolkits' own encoders are tested in test_embed_espnet.py and test_embed_speechbrain.py."""

from __future__ import annotations

import pytest

from helpers.spread import within

torch = pytest.importorskip("torch")
nn = torch.nn

from spkflow.embed.masking import Block, PaddingMask, qualname  # noqa: E402


class Net1d(nn.Module):
    """Convolutions with stride, dilation and no padding, a ceil-mode max pool, an SE squeeze."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv1d(3, 8, 5, stride=2, padding=2)
        self.b = nn.Conv1d(8, 8, 3, dilation=3, padding="same")
        self.pool = nn.MaxPool1d(3, stride=2, ceil_mode=True)
        self.c = nn.Conv1d(8, 8, 3)  # shortens by 2
        self.se = nn.AdaptiveAvgPool1d(1)

    def forward(self, x):  # [B, 3, T] -> [B, 8, T']
        x = torch.relu(self.b(torch.relu(self.a(x))))
        x = self.c(self.pool(x))
        return x * torch.sigmoid(self.se(x))


class Net2d(nn.Module):
    """Conv2d on [B, 1, T, F] (time second to last), strided in time."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(1, 4, 3, stride=(2, 1), padding=1)
        self.b = nn.Conv2d(4, 4, (5, 3), padding=(2, 1))

    def forward(self, x):  # [B, T, F] -> [B, 4 * F, T']
        y = self.b(torch.relu(self.a(x.unsqueeze(1))))
        return y.permute(0, 1, 3, 2).flatten(1, 2)


def check_equal_alone(net: nn.Module, blocks: dict, xs: list, time_first: bool) -> None:
    mask = PaddingMask(net, blocks)
    lens = torch.tensor([x.shape[0] for x in xs])
    padded = torch.nn.utils.rnn.pad_sequence(xs, batch_first=True)
    inp = padded if time_first else padded.transpose(1, 2)
    with torch.no_grad(), mask.active(lens, padded.shape[1]) as m:
        out = net(inp)
        valid = m.lengths(out.shape[-1])
    for i, x in enumerate(xs):
        with torch.no_grad():
            alone = net(x[None] if time_first else x.T[None])
        assert int(valid[i]) == alone.shape[-1]
        # measured <= 1.2e-7 (1 and 2 threads, batch order permuted)
        within("masked padded vs alone", float((out[i, :, : alone.shape[-1]] - alone[0]).abs().max()), 1e-5)


def test_padded_batch_equals_alone_1d_and_2d():
    torch.manual_seed(0)
    xs = [torch.randn(n, 3) for n in (40, 17, 29, 21)]
    check_equal_alone(Net1d().eval(), {qualname(Net1d()): Block()}, xs, time_first=False)
    xs = [torch.randn(n, 6) for n in (30, 11, 21)]
    check_equal_alone(Net2d().eval(), {qualname(Net2d()): Block(time_axis=-2)}, xs, time_first=True)


def test_unknown_layers_are_refused_by_name():
    class Rnn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv1d(2, 2, 3, padding=1)
            self.rnn = nn.LSTM(2, 2)

    ok, why = PaddingMask.supports(Rnn(), {qualname(Rnn()): Block()})
    assert not ok and "layer 'rnn' (torch.nn.modules.rnn.LSTM) may mix padded frames" in why
    ok, why = PaddingMask.supports(Net2d(), {qualname(Net2d()): Block()})
    assert not ok and "layer 'a' (Conv2d): which of its axes is time is not known" in why
    reflect = nn.Sequential(nn.Conv1d(2, 2, 3, padding=1, padding_mode="reflect"))
    assert PaddingMask.supports(reflect, {}) == (False, "layer '0' pads with 'reflect', not zeros")
    with pytest.raises(ValueError, match="LSTM"):
        PaddingMask(Rnn(), {qualname(Rnn()): Block()})


def test_padding_garbage_never_reaches_valid_frames():
    net = nn.Sequential(nn.Conv1d(2, 2, 3, padding=1), nn.AdaptiveAvgPool1d(1)).eval()
    mask = PaddingMask(net, {})
    x = torch.randn(2, 2, 10)
    x[1, :, 6:] = float("nan")
    x[0, :, 9:] = float("inf")
    with torch.no_grad(), mask.active(torch.tensor([9, 6]), 10):
        out = net(x)
    with torch.no_grad():
        alone = [net(x[0:1, :, :9]), net(x[1:2, :, :6])]
    assert torch.isfinite(out).all()
    # measured <= 3e-8 (1 and 2 threads, batch order permuted)
    within("masked non-finite padding vs alone", float((out - torch.cat(alone)).abs().max()), 1e-6)
    with torch.no_grad():  # outside active() the hooks do nothing
        assert torch.isnan(net(x)[1]).all()
