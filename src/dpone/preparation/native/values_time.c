/*
 * Time values: Date32, DateTime64 (of whole minutes where the source type has no seconds), Time64, a
 * datetimeoffset as its UTC instant and offset, all within ClickHouse's range; and
 * UUID, which is text of fixed form like them.
 */
#include "rowbinary.h"

/* ClickHouse's Date32/DateTime64 range, in days since 1970-01-01: 1900-01-01, 2299-12-31. */
#define MIN_DAY (-25567LL)
#define MAX_DAY (120529LL)
#define SECONDS_PER_DAY 86400LL

static const int64_t POW10[10] = {
    1LL, 10LL, 100LL, 1000LL, 10000LL, 100000LL, 1000000LL, 10000000LL, 100000000LL,
    1000000000LL,
};

static int leap(int64_t y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

/* Days from 1970-01-01 to y-m-d of the proleptic Gregorian calendar (y >= 1). */
static int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
    static const int before[12] = {0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334};
    int64_t p = y - 1;
    int64_t days = p * 365 + p / 4 - p / 100 + p / 400; /* days before year y, from 0001-01-01 */
    days += before[m - 1] + (m > 2 && leap(y)) + d - 1;
    return days - 719162; /* 0001-01-01 to 1970-01-01 */
}

/* YYYY-MM-DD at f (10 bytes): its day number, or 0 when it is not a calendar date. */
static int date_at(const uint8_t *f, int64_t *day) {
    static const int month_days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (!all_digits(f, 4) || f[4] != '-' || !all_digits(f + 5, 2) || f[7] != '-' ||
        !all_digits(f + 8, 2))
        return 0;
    int64_t y = digits_value(f, 4), m = digits_value(f + 5, 2), d = digits_value(f + 8, 2);
    if (y < 1 || m < 1 || m > 12 || d < 1) return 0;
    if (d > month_days[m - 1] + (m == 2 && leap(y))) return 0;
    *day = days_from_civil(y, m, d);
    return 1;
}

/* HH:MM:SS(.f{1,9})? spanning f[0..n): ticks of 10^-precision s since midnight. */
static int clock_at(const uint8_t *f, size_t n, int precision, int64_t *ticks, int whole_minute) {
    if (n < 8 || !all_digits(f, 2) || f[2] != ':' || !all_digits(f + 3, 2) || f[5] != ':' ||
        !all_digits(f + 6, 2))
        return 0;
    size_t frac_n = 0;
    if (n > 8) {
        frac_n = n - 9;
        if (f[8] != '.' || frac_n < 1 || frac_n > 9 || !all_digits(f + 9, frac_n)) return 0;
    }
    int64_t hh = digits_value(f, 2), mm = digits_value(f + 3, 2), ss = digits_value(f + 6, 2);
    if (whole_minute && (ss != 0 || !all_zeros(f + 9, frac_n))) return 0;
    if (hh > 23 || mm > 59 || ss > 59) return 0;
    if (frac_n > (size_t)precision) {
        if (!all_zeros(f + 9 + precision, frac_n - precision)) return 0;
        frac_n = (size_t)precision;
    }
    int64_t fraction = digits_value(f + 9, frac_n) * POW10[precision - frac_n];
    *ticks = (hh * 3600 + mm * 60 + ss) * POW10[precision] + fraction;
    return 1;
}

HIDDEN int date_value(out_t *out, const uint8_t *f, size_t n) {
    int64_t day;
    if (n != 10 || !date_at(f, &day) || day < MIN_DAY || day > MAX_DAY) return 0;
    put_int(out, day, 4);
    return 1;
}

HIDDEN int datetime_value(out_t *out, const uint8_t *f, size_t n, int precision, int whole) {
    int64_t day, ticks;
    if (n < 19 || f[10] != ' ' || !date_at(f, &day)) return 0;
    if (!clock_at(f + 11, n - 11, precision, &ticks, whole)) return 0;
    if (day < MIN_DAY || day > MAX_DAY) return 0;
    put_int(out, day * SECONDS_PER_DAY * POW10[precision] + ticks, 8);
    return 1;
}

HIDDEN int time_value(out_t *out, const uint8_t *f, size_t n, int precision) {
    int64_t ticks;
    if (!clock_at(f, n, precision, &ticks, 0)) return 0;
    put_int(out, ticks, 8);
    return 1;
}

/* YYYY-MM-DD HH:MM:SS[.f] +HH:MM: the UTC instant (Int64) and the offset minutes (Int16). */
HIDDEN int dto_value(out_t *out, const uint8_t *f, size_t n, int precision) {
    int64_t day, ticks;
    if (n < 26 || f[10] != ' ' || f[n - 7] != ' ' || !date_at(f, &day)) return 0;
    const uint8_t *o = f + n - 6;
    if ((o[0] != '+' && o[0] != '-') || !all_digits(o + 1, 2) || o[3] != ':' ||
        !all_digits(o + 4, 2))
        return 0;
    if (!clock_at(f + 11, n - 18, precision, &ticks, 0)) return 0;
    int64_t oh = digits_value(o + 1, 2), om = digits_value(o + 4, 2);
    if (om > 59 || oh * 60 + om > 14 * 60) return 0;
    int64_t offset = (oh * 60 + om) * (o[0] == '-' ? -1 : 1);
    int64_t scale = POW10[precision];
    int64_t utc = day * SECONDS_PER_DAY * scale + ticks - offset * 60 * scale;
    if (utc < MIN_DAY * SECONDS_PER_DAY * scale || utc >= (MAX_DAY + 1) * SECONDS_PER_DAY * scale)
        return 0;
    put_int(out, utc, 8);
    put_int(out, offset, 2);
    return 1;
}

/* 8-4-4-4-12 hex digits, either case: each 64-bit half little-endian. */
HIDDEN int uuid_value(out_t *out, const uint8_t *f, size_t n) {
    uint8_t digits[32];
    size_t k = 0;
    if (n != 36) return 0;
    for (size_t i = 0; i < 36; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (f[i] != '-') return 0;
            continue;
        }
        int v = hex_value(f[i]);
        if (v < 0) return 0;
        digits[k++] = (uint8_t)v;
    }
    uint8_t bytes[16];
    for (size_t half = 0; half < 2; half++)
        for (size_t b = 0; b < 8; b++) {
            size_t at = half * 16 + (7 - b) * 2; /* the half's last byte comes first */
            bytes[half * 8 + b] = (uint8_t)(digits[at] << 4 | digits[at + 1]);
        }
    put(out, bytes, 16);
    return 1;
}
