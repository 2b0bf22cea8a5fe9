"""A forecaster's raw table, made up: hourly load and temperature of a few sites, in local time.

The benchmarks of a raw table (``bench.backtest``) and the tests of the calendar, holiday and backtest
code read it. Only a date, a site, the load and the temperature are written; everything a model needs
(time of day, day off, day of year) is left for tamrun to derive. Per site s, hour t (local time):

    load = base_s * (1 + 0.25 * day(hour, day off) + 0.05 * week(dow) + 0.08 * cos(2 pi doy / 365.25))
           + heat_s * max(15 - temperature, 0) + noise (AR(1), 0.8, sd 1.5 % of base_s)
    day off = Saturday, Sunday or a public holiday of ``country`` (holidays package)

``temperature`` follows a yearly and a daily cycle plus AR(1) noise. The table is the same for a seed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

SITE_BASE = (120.0, 80.0, 200.0, 45.0, 150.0, 95.0)  # MW: each site's mean level (sites cycle through these)
HEAT_SLOPE = 0.025  # load per degree below 15 C, as a share of the site's base


def hourly_sites(sites: int = 4, start: str = "2021-01-01", end: str = "2023-12-31", timezone: str = "Europe/Paris",
                 country: str = "FR", seed: int = 0) -> pd.DataFrame:
    """Rows (date, site, load, temperature), ``date`` local and time zone aware, every hour from
    ``start`` to the end of ``end`` in ``timezone`` (so 23 or 25 rows on the days the clocks change)."""
    import holidays  # the table's days off, as the forecaster's calendar has them

    hours = pd.date_range(pd.Timestamp(start, tz=timezone),  # to the local midnight after ``end`` (25 h on its day)
                          (pd.Timestamp(end) + pd.Timedelta(days=1)).tz_localize(timezone), freq="h", inclusive="left")
    days = hours.tz_localize(None).normalize()
    off_days = holidays.country_holidays(country, years=range(hours[0].year, hours[-1].year + 1))
    holiday = np.isin(days.date, np.array(list(off_days), dtype=object))
    day_off = holiday | (hours.day_of_week.to_numpy() >= 5)
    hour = hours.hour.to_numpy()
    daily = np.where(day_off, 0.6 * np.sin(np.pi * np.clip(hour - 8, 0, 14) / 14) - 0.2,
                     np.sin(np.pi * np.clip(hour - 6, 0, 16) / 16) - 0.1 * (hour < 5))
    weekly = np.array([0.02, 0.03, 0.03, 0.02, -0.01, -0.03, -0.06])[hours.day_of_week.to_numpy()]
    yearly = np.cos(2 * np.pi * (hours.day_of_year.to_numpy() - 15) / 365.25)
    rng = np.random.default_rng(seed)
    frames = []
    for s in range(sites):
        base = SITE_BASE[s % len(SITE_BASE)]
        temperature = (11.0 - 8.0 * yearly + 3.0 * np.sin(2 * np.pi * (hour - 9) / 24) + s
                       + 2.5 * ar1(rng, len(hours), 0.97))
        load = (base * (1 + 0.25 * daily + 0.05 * weekly + 0.08 * yearly)
                + HEAT_SLOPE * base * np.maximum(15.0 - temperature, 0.0) + 0.015 * base * ar1(rng, len(hours), 0.8))
        frames.append(pd.DataFrame({"date": hours, "site": f"site_{s + 1}", "load": load.round(3),
                                    "temperature": temperature.round(2)}))
    return pd.concat(frames, ignore_index=True)


def ar1(rng: np.random.Generator, n: int, phi: float) -> np.ndarray:
    """(n,) AR(1) series of unit marginal variance: e_t = phi e_{t-1} + sqrt(1 - phi^2) w_t."""
    shocks = rng.standard_normal(n) * np.sqrt(1 - phi ** 2)
    out = np.empty(n)
    out[0] = rng.standard_normal()
    for t in range(1, n):  # sequential by definition; 26k steps per site
        out[t] = phi * out[t - 1] + shocks[t]
    return out


def write_sites(frame: pd.DataFrame, path: Path, local_naive: bool = False) -> Path:
    """Write ``frame`` as CSV or Parquet (by ``path``'s suffix). Dates carry their UTC offset
    (``2024-03-31 03:00:00+02:00``), or under ``local_naive`` are the local wall time without one (the
    hour the clocks go back then appears twice, the one they skip not at all)."""
    out = frame.copy()
    out["date"] = out["date"].dt.tz_localize(None) if local_naive else out["date"].map(lambda t: t.isoformat())
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        out.to_parquet(path, index=False)
    else:
        out.to_csv(path, index=False)
    return path
