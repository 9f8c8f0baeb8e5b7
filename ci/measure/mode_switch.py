"""Median enter+exit of train_mode with nothing offloaded: 2 vs 28 layers, against the pre-fix behaviour
(move the model "to the device", gc.collect(), empty_cache() on entry), interleaved in one run. 1 rank.

Usage: python ci/measure/mode_switch.py
"""
import gc
import statistics
import sys
import time

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def build(layers):
    def factory():
        from engine.tiny_model import tiny_qwen2

        return tiny_qwen2(seed=0, vocab_size=96, layers=layers, max_positions=32768)
    return factory


def main():
    from engine import EngineConfig, FSDPEngine
    from engine.fsdp.offload import move_model
    engines = {n: FSDPEngine(build(n), EngineConfig(fsdp_version=2)) for n in (2, 28)}

    def fast(engine):  # a block of 100 switches, reported per switch (one is too short for the clock)
        for _ in range(100):
            with engine.train_mode():
                pass

    def walk(engine):  # the seed fix: no move/gc, but module.train() walks every submodule twice
        was = engine.module.training
        engine.module.train(True)
        engine.module.train(was)

    def legacy(engine):
        move_model(engine.module, 2, engine.backend, "device")
        gc.collect()
        engine.backend.empty_cache()
        engine.module.train(True)
        engine.module.train(False)

    times = {(n, k): [] for n in engines for k in ("fast", "walk", "legacy")}
    for rep in range(200):
        for n, engine in engines.items():
            for kind, fn in (("fast", fast), ("walk", walk)) + ((("legacy", legacy),) if rep % 20 == 0 else ()):
                start = time.perf_counter()
                fn(engine)
                times[(n, kind)].append((time.perf_counter() - start) / (100 if kind == "fast" else 1))
    med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    for n in engines:
        print(f"{n:2d} layers: O(1) switch {med[(n, 'fast')]:.2f} us | module.train walk (seed fix) "
              f"{med[(n, 'walk')]:.1f} us | pre-fix move+gc {med[(n, 'legacy')] / 1000:.1f} ms | "
              f"ratio pre-fix/O(1) {med[(n, 'legacy')] / med[(n, 'fast')]:,.0f}x")


if __name__ == "__main__":
    main()
