#ifndef TRUNK_SYNC_COPENSSL_SHIM_H
#define TRUNK_SYNC_COPENSSL_SHIM_H
// OpenSSL 3 spells several operations as function-like macros, which Swift cannot
// import; these inline wrappers give them a callable name.
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <openssl/ssl.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <openssl/ec.h>
#include <openssl/ecdsa.h>
#include <openssl/pem.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>

static inline long trunk_SSL_set_tlsext_host_name(SSL *ssl, const char *name) {
    return SSL_set_tlsext_host_name(ssl, name);
}

static inline int trunk_EVP_PKEY_CTX_set_ec_paramgen_curve_nid(EVP_PKEY_CTX *ctx, int nid) {
    return EVP_PKEY_CTX_set_ec_paramgen_curve_nid(ctx, nid);
}

static inline void trunk_OPENSSL_free(void *ptr) {
    OPENSSL_free(ptr);
}

static inline long trunk_SSL_CTX_set_mode(SSL_CTX *ctx, long mode) {
    return SSL_CTX_set_mode(ctx, mode);
}

static inline int trunk_SSL_CTX_set_min_proto_version(SSL_CTX *ctx, int version) {
    return (int)SSL_CTX_set_min_proto_version(ctx, version);
}

// SHA-256 through the low-level interface. It is deprecated in OpenSSL 3 in favour of
// EVP, but it is the only one that cannot fail: the context is a plain struct (no
// allocation, no provider fetch), so TrunkCrypto's hashes and HMACs never have an error
// to report. It is also the fastest (the same assembly, without EVP's per-call fetch).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static inline void trunk_SHA256_Init(SHA256_CTX *ctx) {
    (void)SHA256_Init(ctx);
}

static inline void trunk_SHA256_Update(SHA256_CTX *ctx, const void *data, size_t count) {
    (void)SHA256_Update(ctx, data, count);
}

static inline void trunk_SHA256_Final(unsigned char *digest, SHA256_CTX *ctx) {
    (void)SHA256_Final(digest, ctx);
}
#pragma GCC diagnostic pop

#endif
