/* The admin status page's files (web/), embedded in the binary at build time by
 * scripts/embed_web.sh (the generated source is <build>/gen/web_assets.c). */
#ifndef KVR_API_WEB_ASSETS_H
#define KVR_API_WEB_ASSETS_H
#include <stddef.h>

/** One embedded file. */
typedef struct kvr_web_asset {
    const char *path;          /**< the admin path it is served at ("/" for index.html) */
    const char *content_type;  /**< its Content-Type */
    const unsigned char *data; /**< its bytes (static) */
    size_t len;                /**< their count */
} kvr_web_asset;

/** Every embedded file, and their count. */
extern const kvr_web_asset kvr_web_assets[];
extern const size_t kvr_web_nassets;

#endif
