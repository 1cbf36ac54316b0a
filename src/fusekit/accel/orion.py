"""ORION 2.0-style router energy, as COMET charges a mesh transfer (Kahng et al., DATE 2009).

Per router: input buffers (word line, bit-line read and write), a 5x5 crossbar with its control,
output flip-flops and clock, and the repeated wires of the channels; each power is multiplied by
the cycles it is active (``hops`` router stages, ``t_q Q / W`` queued flits) and by the routers
and links of an ``e x e`` mesh. Technology constants are ORION's 45 nm set that COMET uses.
"""

from __future__ import annotations

VDD = 0.9
R_DRV = 606.321
I_OFF_P = 1.02e-6
I_OFF_N = 1.02e-6
CG_PWR = 5.34e-16
CD_PWR = 2.67e-16
CGDL = 1.068e-16
CG = 5.34e-16
CD = 2.67e-16
LAMBDA = 0.016
METAL_PITCH = 8.0e-5
CI_DELAY = 3 * (CG + CGDL)
CO_DELAY = 3 * CD
CI = 3.0 * CG_PWR
CO = 3.0 * CD_PWR
FO4 = R_DRV * (3.0 * CD + 12 * CG + 12 * CGDL)
F_CLK = 1.0 / (20 * FO4)
CHANNEL_PITCH = 2.0 * METAL_PITCH
CROSSBAR_PITCH = 2.0 * METAL_PITCH
H_DFQD1 = 8
BUFFER_DEPTH = 3 * 10  # virtual channels x depth


def wire_pj(length: float, k: float, m: float, n: float, cw: float) -> float:
    """Power of a repeated wire of ``length`` (``k`` repeaters, ``m x n`` segments) per cycle."""
    ca = k * (CI + CO) + cw * (length / (m * n))
    return 0.5 * ca * VDD * VDD * F_CLK * m * n


def wire_clock_pj(m: float, w: float, cw: float) -> float:
    """Power of clocking ``m`` rows of ``w`` flip-flops per cycle."""
    columns = H_DFQD1 * METAL_PITCH / CHANNEL_PITCH
    cclk = (1 + 5.0 / 16.0 * (1 + CO_DELAY / CI_DELAY)) * (
        w * CHANNEL_PITCH * cw * columns + w * CI_DELAY
    )
    return m * cclk * VDD * VDD * F_CLK


def dff_pj(m: float, w: float, alpha: float = 1.0) -> float:
    """Power of ``m x w`` D flip-flops at activity ``alpha`` per cycle."""
    cdin = 2 * 0.8 * (CI + CO) + 2 * (2.0 / 3.0 * 0.8 * CO)
    cclk = 2 * 0.8 * (CI + CO) + 2 * (2.0 / 3.0 * 0.8 * CG_PWR)
    return ((alpha * 0.5) * cdin + alpha * cclk) * m * w * VDD * VDD * F_CLK


def word_line_pj(width: float, depth: float, channel: float, cw: float) -> float:
    """Power of a buffer word line (``width`` bits, ``depth`` entries) per access."""
    ccell = 2 * (4.0 * LAMBDA) * CG_PWR + 6 * METAL_PITCH * cw
    x = 1.0 + (5.0 / 16.0) * (1 + CO / CI)
    cpre = x * (cw * (8 * METAL_PITCH + depth) * CI)
    cdec = x * width * ccell
    y = (1 + 0.25) * (1 + CO / CI)
    h = 6 * width * METAL_PITCH
    cbd = y * (cw * h + 3 * channel * CI) + y * (cw * h + 2 * channel * CI)
    return (cbd + 2 * cpre + cdec) * VDD * VDD * F_CLK


def bit_read_pj(depth: float, cw: float) -> float:
    """Power of reading one bit line of a ``depth``-entry buffer."""
    return depth * (4.0 * LAMBDA * CD_PWR + 8 * METAL_PITCH * cw) * VDD * VDD * F_CLK


def bit_write_pj(depth: float, cw: float) -> float:
    """Power of writing one bit line of a ``depth``-entry buffer."""
    cbl = depth * (4.0 * LAMBDA * CD_PWR + 8 * METAL_PITCH * cw)
    return 0.5 * 2 * (CO + CI) * VDD * VDD + cbl * VDD * VDD * F_CLK


def crossbar_pj(width: float, ins: float, outs: float, cw: float) -> float:
    """Power of an ``ins x outs`` crossbar of ``width``-bit ports per traversal."""
    cw_in = width * outs * CROSSBAR_PITCH * cw
    cw_out = width * ins * CROSSBAR_PITCH * cw
    cxi = cw_out / 16.0
    cxo = 4.0 * cxi * (CO_DELAY / CI_DELAY)
    cti = cw_in / 16.0
    cto = 4.0 * cti * (CO_DELAY / CI_DELAY)
    driver = 5.0 / 16.0 * (1 + CO_DELAY / CI_DELAY) * (0.5 * cw * width * outs * CROSSBAR_PITCH
                                                       + cti)  # fmt: skip
    cin = driver + cw_in + cti + outs * cxi
    cout = cw_out + cto + ins * cxo
    return 0.5 * (cin + cout) * VDD * VDD * F_CLK


def crossbar_ctrl_pj(width: float, ins: float, outs: float, cw: float) -> float:
    """Power of that crossbar's control lines per cycle."""
    wx = width * outs * CROSSBAR_PITCH
    hx = width * ins * CROSSBAR_PITCH
    cctrl = width * (5.0 / 16.0) * wx * cw + (wx + hx) * cw
    return ((5.0 / 16.0) * (1 + CO_DELAY / CI_DELAY) * cctrl + cctrl) * VDD * VDD * F_CLK


def router_energy_pj(channel: int, hops: int, t_queue: int, q_bits: int, edge: int) -> float:
    r"""Energy of moving ``q_bits`` over ``hops`` router stages of an ``edge x edge`` mesh.

    Each component's power times its active cycles: ``hops`` (router pipeline) plus
    ``t_queue q / W`` (queued flits of a ``W``-link channel), summed over routers and links.
    """
    w = float(channel)
    k, m, n, length, cw = 8.1, 2.0, 1.0, 2.0, 4.0 * 2.67339e-13
    stream = t_queue * q_bits / w  # cycles of queued flits
    links = edge * (edge * 2 - 2)
    routers = edge * edge
    wire = wire_pj(length, k, m, n, cw) * (hops + stream) * links
    clock = wire_clock_pj(m, length, cw) * 2 * routers
    dff = dff_pj(m, length) * (hops + stream) * links
    depth = BUFFER_DEPTH
    wl = word_line_pj(w, depth, w, cw)
    read = (wl + bit_read_pj(depth, cw) * w) * stream * routers
    write = (wl + bit_write_pj(depth, cw) * w) * stream * routers
    switch = crossbar_pj(w, 5, 5, cw) * w * hops * 3 * routers
    switch_ctrl = crossbar_ctrl_pj(w, 5, 5, cw) * (hops * 3 + stream) * routers
    out = dff_pj(1, w, 1.0) * (hops + stream) * routers
    out_clk = wire_clock_pj(1, w, cw) * hops * 2 * routers
    out_ctrl = out_clk * (hops + stream) * routers
    return wire + clock + dff + read + write + switch + switch_ctrl + out + out_clk + out_ctrl
