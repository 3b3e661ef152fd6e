/* s3.c — S3 (and GCS's S3-compatible API): endpoint, region and
 * credentials from the environment and the AWS shared files, as the AWS
 * CLI and SDKs read them; the signed headers of a request (sigv4.c). */
#include "common.h"
#include "sources/s3.h"
#include "sources/sigv4.h"
#include <ctype.h>
#include <stdlib.h>
#include <strings.h>

static const char *env(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = 0;
    return s;
}

/* key's value in [section] of the INI file at path, malloc'ed, or NULL.
 * The files are the user's own; lines are bounded, the file is read once. */
static char *ini_get(const char *path, const char *section, const char *key) {
    FILE *fp = path ? fopen(path, "r") : NULL;
    if (!fp) return NULL;
    char line[1024], *found = NULL;
    int in = 0;
    while (!found && fgets(line, sizeof line, fp)) {
        char *s = trim(line);
        if (*s == '#' || *s == ';' || !*s) continue;
        if (*s == '[') {
            char *e = strchr(s, ']');
            if (e) { *e = 0; in = !strcmp(trim(s + 1), section); }
            continue;
        }
        char *eq = strchr(s, '=');
        if (!in || !eq) continue;
        *eq = 0;
        if (!strcmp(trim(s), key)) found = strdup(trim(eq + 1));
    }
    fclose(fp);
    return found;
}

static char *home_file(const char *override_env, const char *rel) {
    const char *o = env(override_env);
    if (o) return strdup(o);
    const char *h = env("HOME");
    if (!h) return NULL;
    size_t n = strlen(h) + strlen(rel) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", h, rel);
    return p;
}

void ferry_s3_auth_free(ferry_s3_auth *a) {
    if (!a) return;
    if (a->secret) memset(a->secret, 0, strlen(a->secret));
    free(a->access); free(a->secret); free(a->token); free(a->region);
    memset(a, 0, sizeof *a);
}

int ferry_s3_setup(const char *url, ferry_url *u, ferry_s3_auth *a) { return ferry_s3_setup_opts(url, NULL, u, a); }

/* o's fields, where set, come before the environment's (o NULL: none set). */
int ferry_s3_setup_opts(const char *url, const ferry_remote_opts *o, ferry_url *u, ferry_s3_auth *a) {
    memset(a, 0, sizeof *a);
    a->service = "s3";
    int gs = ferry_url_scheme_of(url) == FERRY_URL_GS;
    const char *profile = o && o->profile ? o->profile : env("AWS_PROFILE") ? env("AWS_PROFILE") : "default";
    char *cfg_path = home_file("AWS_CONFIG_FILE", ".aws/config");
    char *cred_path = home_file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
    /* ~/.aws/config names profiles "[profile NAME]", except "[default]" */
    char section[160];
    snprintf(section, sizeof section, strcmp(profile, "default") ? "profile %s" : "%s", profile);
    ferry_url_env e = {0};
    char *cfg_region = NULL, *cfg_endpoint = NULL;
    if (gs) {
        /* GCS: its own endpoint (or an emulator's); signing region "auto" */
        e.endpoint = o && o->endpoint ? o->endpoint : env("STORAGE_EMULATOR_HOST");
        e.region = "auto";
    } else {
        e.endpoint = o && o->endpoint ? o->endpoint
                   : env("AWS_ENDPOINT_URL_S3") ? env("AWS_ENDPOINT_URL_S3") : env("AWS_ENDPOINT_URL");
        if (!e.endpoint) e.endpoint = cfg_endpoint = ini_get(cfg_path, section, "endpoint_url");
        e.region = o && o->region ? o->region : env("AWS_REGION") ? env("AWS_REGION") : env("AWS_DEFAULT_REGION");
        if (!e.region) e.region = cfg_region = ini_get(cfg_path, section, "region");
    }
    const char *addr = env("FERRY_S3_ADDRESSING");
    int rc = 0;
    if (addr && !strcasecmp(addr, "path")) e.addressing = 1;
    else if (addr && !strcasecmp(addr, "virtual")) e.addressing = 2;
    else if (addr && strcasecmp(addr, "auto"))
        rc = ferry_seterr(FERRY_EINVAL, "FERRY_S3_ADDRESSING=\"%s\": use auto, path or virtual", addr);
    if (o && o->addressing >= 0) e.addressing = o->addressing;
    if (rc == 0) rc = ferry_url_parse(url, &e, u);
    if (rc == 0 && !(a->region = strdup(u->region))) rc = ferry_seterr(FERRY_ENOMEM, "out of memory");
    if (rc == 0 && o && (o->anon || o->key || o->secret)) {   /* the caller's: the environment's are not looked at */
        if (o->anon) {
            snprintf(a->source, sizeof a->source, "anonymous (anon option)");
        } else if (!o->key || !o->secret) {
            rc = ferry_seterr(FERRY_EINVAL, "%s: the remote option %s is set without %s", url, o->key ? "key" : "secret",
                              o->key ? "secret" : "key");
        } else {
            a->access = strdup(o->key);
            a->secret = strdup(o->secret);
            if (o->token) a->token = strdup(o->token);
            snprintf(a->source, sizeof a->source, "the key option");
            if (!a->access || !a->secret || (o->token && !a->token)) rc = ferry_seterr(FERRY_ENOMEM, "out of memory");
        }
    } else if (rc == 0) {
        const char *id = env(gs ? "GS_ACCESS_KEY_ID" : "AWS_ACCESS_KEY_ID");
        const char *sk = env(gs ? "GS_SECRET_ACCESS_KEY" : "AWS_SECRET_ACCESS_KEY");
        if (id && sk) {
            a->access = strdup(id);
            a->secret = strdup(sk);
            if (!gs && env("AWS_SESSION_TOKEN")) a->token = strdup(env("AWS_SESSION_TOKEN"));
            snprintf(a->source, sizeof a->source, "%s", gs ? "GS_ACCESS_KEY_ID" : "AWS_ACCESS_KEY_ID");
        } else if (id || sk) {
            rc = ferry_seterr(FERRY_EINVAL, "%s: %s is set without %s", url,
                              id ? (gs ? "GS_ACCESS_KEY_ID" : "AWS_ACCESS_KEY_ID") : (gs ? "GS_SECRET_ACCESS_KEY" : "AWS_SECRET_ACCESS_KEY"),
                              id ? (gs ? "GS_SECRET_ACCESS_KEY" : "AWS_SECRET_ACCESS_KEY") : (gs ? "GS_ACCESS_KEY_ID" : "AWS_ACCESS_KEY_ID"));
        } else if (!gs) {
            a->access = ini_get(cred_path, profile, "aws_access_key_id");
            a->secret = ini_get(cred_path, profile, "aws_secret_access_key");
            a->token = ini_get(cred_path, profile, "aws_session_token");
            if (a->access && a->secret) snprintf(a->source, sizeof a->source, "profile \"%.60s\"", profile);
            else if (a->access || a->secret)
                rc = ferry_seterr(FERRY_EINVAL, "%s: profile \"%s\" of %s has only one of aws_access_key_id, aws_secret_access_key",
                                  url, profile, cred_path ? cred_path : "~/.aws/credentials");
            else if (env("AWS_PROFILE") || (o && o->profile))
                rc = ferry_seterr(FERRY_EINVAL, "%s: %s=%s has no keys in %s", url, o && o->profile ? "profile" : "AWS_PROFILE", profile,
                                  cred_path ? cred_path : "~/.aws/credentials");
        }
        if (rc == 0 && !a->access) {   /* anonymous: public buckets */
            free(a->secret); free(a->token);
            a->secret = a->token = NULL;
            snprintf(a->source, sizeof a->source, "anonymous");
        }
        if (rc == 0 && a->access && (!a->secret || (env("AWS_SESSION_TOKEN") && !gs && !a->token)))
            rc = ferry_seterr(FERRY_ENOMEM, "out of memory");
    }
    free(cfg_region); free(cfg_endpoint); free(cfg_path); free(cred_path);
    if (rc < 0) ferry_s3_auth_free(a);
    return rc;
}

int ferry_s3_sign(const ferry_s3_auth *a, const ferry_url *u, const char *method, const char *query, time_t now,
                  ferry_s3_signed *out) {
    return ferry_s3_sign_body(a, u, method, query, NULL, now, out);
}

int ferry_s3_sign_body(const ferry_s3_auth *a, const ferry_url *u, const char *method, const char *query,
                       const char *payload_hash, time_t now, ferry_s3_signed *out) {
    out->n = 0;
    if (!a->access) return 0;
    char date[17], hash[65];
    uint8_t d[32];
    ferry_amz_date(now, date);
    if (payload_hash) {
        snprintf(hash, sizeof hash, "%s", payload_hash);
    } else {
        ferry_sha256("", 0, d);
        ferry_hex32(d, hash);
    }
    ferry_sigv4_header h[4];
    int n = 0;
    h[n++] = (ferry_sigv4_header){"host", u->host};
    h[n++] = (ferry_sigv4_header){"x-amz-content-sha256", hash};
    h[n++] = (ferry_sigv4_header){"x-amz-date", date};
    if (a->token) h[n++] = (ferry_sigv4_header){"x-amz-security-token", a->token};
    ferry_sigv4_req r = {method, u->path, query ? query : "", h, n, hash, date, a->region, a->service, a->access, a->secret};
    char auth[1400];
    int rc = ferry_sigv4_authorization(&r, auth, sizeof auth);
    if (rc < 0) return rc;
    snprintf(out->line[out->n++], sizeof out->line[0], "x-amz-date: %s", date);
    snprintf(out->line[out->n++], sizeof out->line[0], "x-amz-content-sha256: %s", hash);
    if (a->token) {
        int w = snprintf(out->line[out->n++], sizeof out->line[0], "x-amz-security-token: %s", a->token);
        if (w < 0 || (size_t)w >= sizeof out->line[0]) return ferry_seterr(FERRY_EINVAL, "AWS_SESSION_TOKEN too long (%zu bytes)", strlen(a->token));
    }
    snprintf(out->line[out->n++], sizeof out->line[0], "Authorization: %s", auth);
    return 0;
}
