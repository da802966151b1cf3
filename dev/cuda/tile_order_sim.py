"""dev/cuda/tile_order_sim.py - a model of how evenly the sm90 forward's tile schedulers
(src/impl/cuda/sm90/sm90_fwd.cuh, TileSched) spread a problem's tiles over the SMs, on the lab's
bench shapes (B * T = 16384, Hq * D = 2048). A tile (query block of one (batch, head)) costs its
key blocks plus a fixed overhead; one CTA per SM. Printed: each scheduler's finishing time over
the ideal one (the total cost / the SMs), causal and not:

  grid    one CTA per tile, launched in grid order (query blocks reversed, fastest) and handed by
          the hardware to whichever SM is free (greedy)
  stride  kSchedStride: CTA c takes tiles c, c + SMs, ... of tile_of's order (sections of heads
          whose K and V fit half of a 50 MB L2, longest first within each)
  snake   kSchedSnake: every other wave reversed, one section under a causal band
  atomic  (not built) the next tile to whichever CTA is free, in tile_of's order: what an atomic
          tile counter would give, with sections and with one

It models the balance only: no L2 misses, no overlap of one tile's epilogue with the next one's
loads (the persistent kernels' gain at short tiles), no per-launch cost. Usage:
python3 dev/cuda/tile_order_sim.py [SMs, default 132 (an H100 / H200)]"""
import heapq
import sys


def tile_of(t, m_blocks, pairs, section):
    """sm90_fwd.cuh's tile_of: (query block, (batch, head) pair) of tile t."""
    per_section = m_blocks * section
    sec, r = divmod(t, per_section)
    width = min(section, pairs - sec * section)
    return m_blocks - 1 - r // width, sec * section + r % width


def greedy(order, sms, cost):
    """Each tile in turn to the SM that frees first; the finishing time."""
    free = [0.0] * sms
    for tile in order:
        heapq.heappush(free, heapq.heappop(free) + cost(tile))
    return max(free)


def static(order, sms, cost, snake):
    """Tile i to CTA i % sms (reversed in odd waves with snake); the finishing time."""
    load = [0.0] * sms
    for i, tile in enumerate(order):
        wave, pos = divmod(i, sms)
        load[sms - 1 - pos if snake and wave % 2 else pos] += cost(tile)
    return max(load)


def main():
    sms = int(sys.argv[1]) if len(sys.argv) > 1 else 132
    l2 = 50 << 20
    overhead = 1.0  # key blocks' worth of prologue and epilogue per tile
    # (D, rows per tile, keys per block): sm90_launch.cu's configurations
    for d, bm, bn in ((64, 192, 128), (128, 128, 128), (256, 128, 64)):
        for t in (512, 2048, 8192):
            b, h = 16384 // t, 2048 // d
            pairs, m_blocks = b * h, -(-t // bm)
            section = max(1, min(pairs, l2 // 2 // (t * d * 4)))
            grid_order = [(m_blocks - 1 - x, p) for p in range(pairs) for x in range(m_blocks)]
            for causal in (0, 1):
                def cost(tile):
                    keys = min(t, (tile[0] + 1) * bm) if causal else t
                    return -(-keys // bn) + overhead

                ideal = sum(cost(tile) for tile in grid_order) / sms
                sectioned = [tile_of(i, m_blocks, pairs, section) for i in range(m_blocks * pairs)]
                whole = [tile_of(i, m_blocks, pairs, pairs) for i in range(m_blocks * pairs)]
                snake_order = whole if causal else sectioned
                row = {
                    "grid": greedy(grid_order, sms, cost),
                    "stride": static(sectioned, sms, cost, False),
                    "snake": static(snake_order, sms, cost, True),
                    "atomic": greedy(sectioned, sms, cost),
                    "atomic one section": greedy(whole, sms, cost),
                }
                cells = ", ".join(f"{k} {v / ideal:.3f}" for k, v in row.items())
                print(f"D={d} T={t} causal={causal} tiles={len(grid_order)} section={section}: {cells}")


if __name__ == "__main__":
    main()
