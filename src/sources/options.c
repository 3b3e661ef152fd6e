/* options.c — remote options given with a context: checked when they are
 * set (a wrong name or value is an error then, not a surprise at the first
 * request), kept as strings for s3.c and http.c. */
#include "common.h"
#include "sources/ropts.h"
#include "sources/url.h"
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>
#include <errno.h>

void ferry_remote_opts_init(ferry_remote_opts *o) {
    memset(o, 0, sizeof *o);
    o->addressing = -1;
}

void ferry_remote_opts_free(ferry_remote_opts *o) {
    if (!o) return;
    if (o->secret) memset(o->secret, 0, strlen(o->secret));
    free(o->endpoint); free(o->key); free(o->secret); free(o->token); free(o->profile); free(o->region);
    free(o->ca_bundle);
    ferry_remote_opts_init(o);
}

static int set_str(char **slot, const char *value) {
    char *v = NULL;
    if (value && !(v = strdup(value))) return ferry_seterr(FERRY_ENOMEM, "out of memory");
    free(*slot);
    *slot = v;
    return 0;
}

static int no_controls(const char *name, const char *v) {
    for (const char *p = v; p && *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return ferry_seterr(FERRY_EINVAL, "remote option %s: control characters are not allowed", name);
    return 0;
}

int ferry_remote_opts_set(ferry_remote_opts *o, const char *name, const char *value) {
    if (!o || !name) return ferry_seterr(FERRY_EINVAL, "remote option: no name");
    int rc = no_controls(name, value);
    if (rc < 0) return rc;
    if (value && !*value) value = NULL;   /* "" as unset: what an empty storage_options field means */
    if (!strcmp(name, "endpoint_url")) {
        ferry_url_scheme s = ferry_url_scheme_of(value);
        if (value && s != FERRY_URL_HTTP && s != FERRY_URL_HTTPS)
            return ferry_seterr(FERRY_EINVAL, "remote option endpoint_url=\"%s\": an http:// or https:// URL", value);
        return set_str(&o->endpoint, value);
    }
    if (!strcmp(name, "key")) return set_str(&o->key, value);
    if (!strcmp(name, "secret")) return set_str(&o->secret, value);
    if (!strcmp(name, "token")) return set_str(&o->token, value);
    if (!strcmp(name, "profile")) return set_str(&o->profile, value);
    if (!strcmp(name, "region")) {
        for (const char *p = value; p && *p; p++)
            if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-'))
                return ferry_seterr(FERRY_EINVAL, "remote option region=\"%s\": not a region name", value);
        return set_str(&o->region, value);
    }
    if (!strcmp(name, "addressing")) {
        if (!value) o->addressing = -1;
        else if (!strcasecmp(value, "auto")) o->addressing = 0;
        else if (!strcasecmp(value, "path")) o->addressing = 1;
        else if (!strcasecmp(value, "virtual")) o->addressing = 2;
        else return ferry_seterr(FERRY_EINVAL, "remote option addressing=\"%s\": auto, path or virtual", value);
        return 0;
    }
    if (!strcmp(name, "anon")) {
        if (!value || !strcasecmp(value, "false") || !strcmp(value, "0")) o->anon = 0;
        else if (!strcasecmp(value, "true") || !strcmp(value, "1")) o->anon = 1;
        else return ferry_seterr(FERRY_EINVAL, "remote option anon=\"%s\": true or false", value);
        return 0;
    }
    if (!strcmp(name, "ca_bundle")) {
        if (value && access(value, R_OK) != 0)
            return ferry_seterr(FERRY_EINVAL, "remote option ca_bundle=\"%s\": %s", value, strerror(errno));
        return set_str(&o->ca_bundle, value);
    }
    return ferry_seterr(FERRY_EINVAL, "unknown remote option \"%s\" (endpoint_url, key, secret, token, profile, region, "
                        "addressing, anon, ca_bundle)", name);
}
