/* Table-driven command-line flags shared by kvroute and kvroute-sim: one row per flag (name,
 * type, offset of the field it sets in a caller's struct, bounds, help), `--name value` and
 * `--name=value`, and a usage printer that shows each flag's default. */
#ifndef KVR_UTIL_FLAGS_H
#define KVR_UTIL_FLAGS_H
#include <stddef.h>
#include <stdio.h>

/** What a row's field is. Numeric types are parsed with strtod and must be finite, inside the
 *  row's [min, max], and (all but DOUBLE) integral; U64 and SIZE given as plain digits are read
 *  exactly (a double rounds above 2^53). The row's bounds must fit the field's C type. */
typedef enum {
    KVR_FLAG_STR,    /**< const char *: points into argv (not copied, not freed) */
    KVR_FLAG_INT,    /**< int */
    KVR_FLAG_LONG,   /**< long */
    KVR_FLAG_U32,    /**< uint32_t */
    KVR_FLAG_U64,    /**< uint64_t */
    KVR_FLAG_SIZE,   /**< size_t */
    KVR_FLAG_DOUBLE, /**< double */
    KVR_FLAG_CUSTOM, /**< the row's `set` callback parses the value (enums, repeatable flags) */
    KVR_FLAG_BOOL,   /**< int, 0 or 1: `--name` alone sets 1; a value (`--name=false`, or from a
                          config file) must be true/false/1/0/yes/no/on/off */
} kvr_flag_type;

typedef struct kvr_flag kvr_flag;

/** Parses `value` for a KVR_FLAG_CUSTOM row into `target` (the whole struct given to
 *  kvr_flags_parse; the field is at f->off). `value` points into argv and lives as long as it.
 *  Returns 0, or -1 after optionally writing a message to `err` (cap bytes); left empty, the
 *  parser writes "--NAME: bad value 'VALUE' (expected HELP)". */
typedef int (*kvr_flag_set_fn)(void *target, const kvr_flag *f, const char *value, char *err,
                               size_t cap);
/** Prints a KVR_FLAG_CUSTOM row's current value of `target` (no newline) for the usage text. */
typedef void (*kvr_flag_show_fn)(FILE *out, const void *target, const kvr_flag *f);

/** One flag. Tables are static const arrays owned by the caller; rows are matched by exact name
 *  (the last row wins on a duplicate). */
struct kvr_flag {
    const char *name;      /**< without the leading "--" */
    kvr_flag_type type;
    size_t off;            /**< offsetof() the field in the target struct */
    double min, max;       /**< inclusive bounds of numeric types; unused otherwise */
    const char *help;      /**< one line, no trailing newline */
    kvr_flag_set_fn set;   /**< KVR_FLAG_CUSTOM only (required there) */
    kvr_flag_show_fn show; /**< KVR_FLAG_CUSTOM only; NULL = no default shown */
};

/** Parses argv[1..argc-1] into `target` using the `n` rows of `table`; values are applied in
 *  order, so a repeated non-custom flag keeps its last value. Returns 0 when all were applied;
 *  1 on `--help` or `-h` (nothing printed: the caller prints its usage); -1 on the first
 *  positional argument, unknown flag, missing value or bad value, with a one-line message
 *  (no program name, no newline) in `err` (cap bytes). `target` may be partly updated on -1. */
int kvr_flags_parse(const kvr_flag *table, size_t n, void *target, int argc, char **argv,
                    char *err, size_t cap);

/** The row named `name` (without "--"), or NULL. The last row wins on a duplicate. */
const kvr_flag *kvr_flags_find(const kvr_flag *table, size_t n, const char *name);

/** Parses `value` for row `f` into `target`, exactly as the command line would (bounds, types,
 *  custom setters). STR values are stored as the pointer given (the caller keeps `value` alive
 *  as long as `target` uses it). Returns 0, or -1 with a message ("--NAME: bad value ...") in
 *  `err` (cap bytes). */
int kvr_flags_set(const kvr_flag *f, void *target, const char *value, char *err, size_t cap);

/** Prints one line per row to `out`: "  --NAME  HELP [DEFAULT]", the name left-aligned in
 *  `width` columns. DEFAULT is read from `defaults` (a default-initialised target struct;
 *  unset strings show as "unset"); with `defaults` NULL no defaults are printed. */
void kvr_flags_usage(FILE *out, const kvr_flag *table, size_t n, const void *defaults,
                     int width);

#endif
