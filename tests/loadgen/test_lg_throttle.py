from admit.loadgen.throttle import AdaptiveThrottle, RetryBudget


def test_sre_throttle_formula_and_window_expiry():
    th = AdaptiveThrottle(k=2.0, window_s=10)
    assert th.reject_probability(0.0) == 0.0
    for _ in range(99):
        th.should_reject(1.0, 0.999)  # wanted attempts, never accepted
    th.on_response(1.0, accepted=True)
    # requests=99, accepts=1 → (99 - 2) / 100
    assert abs(th.reject_probability(1.5) - 0.97) < 1e-9
    assert th.reject_probability(11.5) == 0.0  # everything from second 1 has left the 10 s window


def test_sre_throttle_never_rejects_when_server_accepts_enough():
    th = AdaptiveThrottle(k=2.0)
    for i in range(1000):
        assert not th.should_reject(i / 100, 0.0)
        th.on_response(i / 100, accepted=i % 2 == 0)  # half accepted: requests = 2·accepts


def test_retry_budget_caps_retries_at_ratio_of_first_attempts():
    b = RetryBudget(ratio=0.1, window_s=10)
    for _ in range(100):
        b.on_first_attempt(0.5)
    spent = sum(b.try_spend(0.6) for _ in range(50))
    assert spent == 10
