"""Checks of the calendar settings, before any data is read: data.timezone (an IANA zone), data.holidays and
data.holiday_subdivision (a country and subdivision the holidays package knows), the derived columns of
kind calendar (their part) and holiday (a country to read), and the modes that count days in the table's
own dates (refused with data.timezone)."""

from __future__ import annotations

from typing import Any, Optional

from tamrun.config.schema import CALENDAR_PARTS, Config, ModeName
from tamrun.errors import ConfigError

SHOWN = 12  # the codes a message lists


def check_calendar(cfg: Config) -> None:
    """Every calendar setting of ``cfg`` (`ConfigError` naming the field, its value and the fix)."""
    data = cfg.data
    check_timezone(data.timezone)
    check_country(data.holidays, data.holiday_subdivision)
    for name, spec in data.derived.items():
        field = f"data.derived.{name}"
        if spec.kind == "calendar" and spec.part not in CALENDAR_PARTS:
            raise ConfigError(f"{field}.part", spec.part, "not a part of the calendar",
                              f"use one of {', '.join(CALENDAR_PARTS)}, e.g. {field}.part=time_of_day")
        if spec.bridge and not (spec.kind == "holiday" or (spec.kind == "calendar" and spec.part == "day_off")):
            raise ConfigError(f"{field}.bridge", True, f"bridge days are marked by a holiday column or a calendar "
                              f"day_off, not by {spec.kind}{'' if spec.part is None else ' ' + spec.part}",
                              f"set {field}.bridge=false, or use kind holiday")
        if spec.kind == "holiday" and data.holidays is None:
            raise ConfigError("data.holidays", None, f"{field} marks public holidays, and no country is named",
                              "set data.holidays to a country code (data.holidays=FR, DE, US, GB, ...)")
    day_ahead = cfg.mode.name in (ModeName.adaptive, ModeName.aggregate)
    if data.timezone is not None and day_ahead:
        raise ConfigError("data.timezone", data.timezone, f"mode={cfg.mode.name.value} counts its days in the "
                          "table's own dates, which data.timezone holds in UTC: its day-ahead forecasts would "
                          "start at UTC midnights, not local ones", "unset data.timezone (dates taken as they are, "
                          "their local days then) for this mode, or use mode=run")


def check_timezone(timezone: Optional[str]) -> None:
    """data.timezone names a zone of the IANA database (Europe/Paris, America/New_York, UTC)."""
    if timezone is None:
        return
    import zoneinfo

    try:
        zoneinfo.ZoneInfo(str(timezone))
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ConfigError("data.timezone", timezone, "not a time zone of the IANA database",
                          "name one such as Europe/Paris, America/New_York or UTC (the list: "
                          "python -c 'import zoneinfo; print(sorted(zoneinfo.available_timezones()))'), or "
                          "null to take the dates as they are") from None


def check_country(country: Optional[str], subdivision: Optional[str]) -> None:
    """data.holidays names a country of the holidays package, and data.holiday_subdivision one of its
    subdivisions (or is null)."""
    if country is None:
        if subdivision is not None:
            raise ConfigError("data.holiday_subdivision", subdivision, "a subdivision without a country",
                              "set data.holidays to its country (e.g. data.holidays=DE data.holiday_subdivision=BY)")
        return
    import holidays  # the countries it maintains

    supported = holidays.list_supported_countries()
    if country not in supported:
        near = [code for code in supported if code.lower() == str(country).lower()]
        raise ConfigError("data.holidays", country, "not a country the holidays package knows",
                          f"use data.holidays={near[0]}" if near else "give its ISO 3166 code such as FR, DE, US, GB "
                          "(the list: python -c 'import holidays; print(sorted(holidays.list_supported_countries()))')")
    known = supported[country]
    if subdivision is not None and subdivision not in known:
        raise ConfigError("data.holiday_subdivision", subdivision, f"not a subdivision of {country} the holidays "
                          f"package knows", f"use one of {shown(known)}, or null for the national holidays"
                          if known else f"set data.holiday_subdivision=null ({country} has none)")


def shown(codes: Any) -> str:
    """The first `SHOWN` codes, comma separated, '...' when there are more."""
    codes = [str(code) for code in codes]
    return ", ".join(codes[:SHOWN]) + (", ..." if len(codes) > SHOWN else "")

