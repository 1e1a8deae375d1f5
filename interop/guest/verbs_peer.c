/* verbs_peer: a small libibverbs program, scripted line by line over stdin/stdout.
 *
 * Every command is one line "verb key=value ..." (numbers: decimal or 0x hex) and gets exactly
 * one reply line: "ok key=value ..." or "err <message>". At start it prints
 * "ready dev=rxe0 gid=... gid_index=N ip=... mac=... port_mtu=N" (or "fatal <message>").
 *
 *   info                                   device, GID (IPv4-mapped, looked up), IP, MAC
 *   qp id=Q [mtu=1024] [psn=0] [sq=64] [rq=64] [cqe=256] [sge=8]
 *                                          RC QP with its own CQ, moved to INIT with remote
 *                                          write/read/atomic access (sge: max send and
 *                                          receive SGEs a WQE) -> qpn= psn=
 *   mr id=M size=N                         zeroed buffer, registered local write + remote
 *                                          write/read/atomic -> addr= rkey= lkey= size=
 *   connect qp=Q rqpn=N rpsn=N ip=A.B.C.D [mac=aa:..] [mtu=] [timeout=0] [retry=7]
 *           [rnr_retry=7] [min_rnr=1] [rd_atomic=16]
 *                                          INIT->RTR->RTS; mac= adds a permanent neighbour
 *                                          entry (the peer answers no ARP); timeout 0 = no
 *                                          retransmission; the reply echoes what
 *                                          ibv_query_qp reads back (timeout retry rnr_retry
 *                                          min_rnr mtu)
 *   write  qp=Q mr=M off=O len=L raddr=A rkey=K [imm=I] [wr=W] [signaled=1]
 *   write_imm qp=Q mr=M off=O len=L raddr=A rkey=K imm=I [wr=W]   RDMA WRITE with immediate
 *   read   qp=Q mr=M off=O len=L raddr=A rkey=K [wr=W]
 *   fadd   qp=Q mr=M off=O raddr=A rkey=K add=V [wr=W]       8-byte FETCH_ADD (old -> mr+off)
 *   cswap  qp=Q mr=M off=O raddr=A rkey=K cmp=C swap=S [wr=W] 8-byte COMPARE_SWAP
 *   send   qp=Q mr=M off=O len=L [imm=I] [wr=W]
 *   send_imm qp=Q mr=M off=O len=L imm=I [wr=W]              SEND with immediate
 *   recv   qp=Q mr=M off=O len=L [wr=W]
 *          write, write_imm, send, send_imm and recv take a scatter/gather list on the one MR
 *          instead of off= len=: sge=OFF:LEN,OFF:LEN,... (up to 16 entries, qp sge= bounds it)
 *   poll   qp=Q [ms=1000]                  one completion: wr= status= status_str= status_name=
 *                                          opcode= opcode_num= byte_len= qp_num= src_qp=
 *                                          wc_flags= with_imm=0|1 [imm=] (imm in host order,
 *                                          ntohl of the wire's) ; "ok empty" after ms
 *   wmem   mr=M off=O hex=0011..           write bytes into the local buffer
 *   rmem   mr=M off=O len=L                -> hex=...
 *   state  qp=Q                            -> state= (ibv_qp_state number)
 *   counters                               rxe hw_counters -> name=value ...
 *   quit                                   "ok bye" and exit
 */
#include <infiniband/verbs.h>
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <time.h>

#define MAXOBJ 64
#define MAXARG 24
#define MAXSGE 16

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_port_attr port_attr;
static int gid_index = -1;
static union ibv_gid gid;
static char ip_str[32], mac_str[32], netdev[32] = "eth0";
static struct { struct ibv_qp *qp; struct ibv_cq *cq; uint32_t psn; enum ibv_mtu mtu; } qps[MAXOBJ];
static struct { struct ibv_mr *mr; char *buf; size_t size; } mrs[MAXOBJ];

/* ---- argument parsing ---------------------------------------------------------- */
static int nargs;
static char *keys[MAXARG], *vals[MAXARG];

static const char *arg(const char *k) {
    for (int i = 0; i < nargs; i++)
        if (!strcmp(keys[i], k)) return vals[i];
    return NULL;
}
static int has(const char *k) { return arg(k) != NULL; }
static uint64_t num(const char *k, uint64_t dflt) {
    const char *v = arg(k);
    return v ? strtoull(v, NULL, 0) : dflt;
}

#define ERR(...) do { printf("err " __VA_ARGS__); printf("\n"); return; } while (0)
#define NEED(k) do { if (!has(k)) ERR("missing %s=", k); } while (0)

static int get_qp(int *q) {
    *q = (int)num("qp", 0);
    return *q >= 0 && *q < MAXOBJ && qps[*q].qp;
}
static int get_mr(int *m, uint64_t off, uint64_t len) {
    *m = (int)num("mr", 0);
    return *m >= 0 && *m < MAXOBJ && mrs[*m].mr && off + len <= mrs[*m].size && off + len >= off;
}

static enum ibv_mtu mtu_enum(int bytes) {
    switch (bytes) {
    case 256: return IBV_MTU_256;   case 512: return IBV_MTU_512;
    case 1024: return IBV_MTU_1024; case 2048: return IBV_MTU_2048;
    case 4096: return IBV_MTU_4096; default: return 0;
    }
}

/* ---- setup ----------------------------------------------------------------------- */
static int setup(void) {
    int n;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list || n < 1) { printf("fatal no RDMA device\n"); return -1; }
    ctx = ibv_open_device(list[0]);
    if (!ctx) { printf("fatal ibv_open_device: %s\n", strerror(errno)); return -1; }
    pd = ibv_alloc_pd(ctx);
    if (!pd || ibv_query_port(ctx, 1, &port_attr)) { printf("fatal pd/port\n"); return -1; }
    for (int tries = 0; tries < 50 && gid_index < 0; tries++) {   /* GIDs appear asynchronously */
        for (int i = 0; i < port_attr.gid_tbl_len; i++) {
            union ibv_gid g;
            static const uint8_t v4pfx[12] = {0,0,0,0,0,0,0,0,0,0,0xff,0xff};
            if (ibv_query_gid(ctx, 1, i, &g)) break;
            if (!memcmp(g.raw, v4pfx, 12)) { gid_index = i; gid = g; break; }
        }
        if (gid_index < 0) { struct timespec ts = {0, 100000000}; nanosleep(&ts, NULL); }
    }
    if (gid_index < 0) { printf("fatal no IPv4-mapped GID\n"); return -1; }
    inet_ntop(AF_INET, gid.raw + 12, ip_str, sizeof ip_str);
    char path[96];
    snprintf(path, sizeof path, "/sys/class/net/%s/address", netdev);
    FILE *f = fopen(path, "r");
    if (f) { if (fscanf(f, "%31s", mac_str) != 1) mac_str[0] = 0; fclose(f); }
    printf("ready dev=%s gid=::ffff:%s gid_index=%d ip=%s mac=%s port_mtu=%d\n",
           ibv_get_device_name(list[0]), ip_str, gid_index, ip_str, mac_str,
           128 << port_attr.active_mtu);
    return 0;
}

/* ---- commands -------------------------------------------------------------------- */
static void cmd_qp(void) {
    int q = (int)num("id", 0);
    if (q < 0 || q >= MAXOBJ || qps[q].qp) ERR("bad or used id");
    enum ibv_mtu mtu = mtu_enum((int)num("mtu", 1024));
    if (!mtu) ERR("bad mtu");
    struct ibv_cq *cq = ibv_create_cq(ctx, (int)num("cqe", 256), NULL, NULL, 0);
    if (!cq) ERR("ibv_create_cq: %s", strerror(errno));
    struct ibv_qp_init_attr ia = {
        .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
        .cap = { .max_send_wr = (uint32_t)num("sq", 64), .max_recv_wr = (uint32_t)num("rq", 64),
                 .max_send_sge = (uint32_t)num("sge", 8), .max_recv_sge = (uint32_t)num("sge", 8) },
    };
    struct ibv_qp *qp = ibv_create_qp(pd, &ia);
    if (!qp) { ibv_destroy_cq(cq); ERR("ibv_create_qp: %s", strerror(errno)); }
    struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
        .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                           IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC };
    int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (rc) { ibv_destroy_qp(qp); ibv_destroy_cq(cq); ERR("modify INIT: %s", strerror(rc)); }
    qps[q].qp = qp; qps[q].cq = cq; qps[q].mtu = mtu;
    qps[q].psn = (uint32_t)num("psn", 0) & 0xffffff;
    printf("ok qp=%d qpn=0x%x psn=0x%x\n", q, qp->qp_num, qps[q].psn);
}

static void cmd_mr(void) {
    int m = (int)num("id", 0);
    size_t size = num("size", 4096);
    if (m < 0 || m >= MAXOBJ || mrs[m].mr) ERR("bad or used id");
    char *buf = aligned_alloc(4096, (size + 4095) & ~(size_t)4095);
    if (!buf) ERR("out of memory");
    memset(buf, 0, size);
    struct ibv_mr *mr = ibv_reg_mr(pd, buf, size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
    if (!mr) { free(buf); ERR("ibv_reg_mr: %s", strerror(errno)); }
    mrs[m].mr = mr; mrs[m].buf = buf; mrs[m].size = size;
    printf("ok mr=%d addr=0x%llx rkey=0x%x lkey=0x%x size=%zu\n", m,
           (unsigned long long)(uintptr_t)buf, mr->rkey, mr->lkey, size);
}

static void cmd_info(void) {
    printf("ok gid=::ffff:%s gid_index=%d ip=%s mac=%s port_mtu=%d netdev=%s\n",
           ip_str, gid_index, ip_str, mac_str, 128 << port_attr.active_mtu, netdev);
}

static void cmd_connect(void) {
    int q;
    if (!get_qp(&q)) ERR("bad qp");
    NEED("rqpn"); NEED("ip");
    struct in_addr rip;
    if (inet_pton(AF_INET, arg("ip"), &rip) != 1) ERR("bad ip");
    if (has("mac") && strcmp(arg("ip"), ip_str)) {          /* a remote peer: static neighbour */
        char cmd[160];
        snprintf(cmd, sizeof cmd, "/usr/sbin/ip neigh replace %s lladdr %s nud permanent dev %s",
                 arg("ip"), arg("mac"), netdev);
        if (system(cmd)) ERR("'%s' failed", cmd);
    }
    enum ibv_mtu mtu = has("mtu") ? mtu_enum((int)num("mtu", 0)) : qps[q].mtu;
    if (!mtu) ERR("bad mtu");
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTR, .path_mtu = mtu, .dest_qp_num = (uint32_t)num("rqpn", 0),
        .rq_psn = (uint32_t)num("rpsn", 0) & 0xffffff, .max_dest_rd_atomic = (uint8_t)num("rd_atomic", 16),
        .min_rnr_timer = (uint8_t)num("min_rnr", 1),
        .ah_attr = { .is_global = 1, .port_num = 1, .sl = 0,
                     .grh = { .sgid_index = (uint8_t)gid_index, .hop_limit = 64 } },
    };
    memset(a.ah_attr.grh.dgid.raw + 10, 0xff, 2);
    memcpy(a.ah_attr.grh.dgid.raw + 12, &rip, 4);
    int rc = ibv_modify_qp(qps[q].qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                           IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (rc) ERR("modify RTR: %s", strerror(rc));
    struct ibv_qp_attr b = {
        .qp_state = IBV_QPS_RTS, .timeout = (uint8_t)num("timeout", 0), .retry_cnt = (uint8_t)num("retry", 7),
        .rnr_retry = (uint8_t)num("rnr_retry", 7), .sq_psn = qps[q].psn, .max_rd_atomic = (uint8_t)num("rd_atomic", 16),
    };
    rc = ibv_modify_qp(qps[q].qp, &b, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                       IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
    if (rc) ERR("modify RTS: %s", strerror(rc));
    /* read back what the QP holds: the attributes really reached ibv_modify_qp */
    struct ibv_qp_attr r;
    struct ibv_qp_init_attr ri;
    rc = ibv_query_qp(qps[q].qp, &r, IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                      IBV_QP_RNR_RETRY | IBV_QP_MIN_RNR_TIMER | IBV_QP_SQ_PSN | IBV_QP_RQ_PSN |
                      IBV_QP_DEST_QPN, &ri);
    if (rc) ERR("ibv_query_qp: %s", strerror(rc));
    printf("ok qp=%d state=RTS qpn=0x%x psn=0x%x rqpn=0x%x rpsn=0x%x mtu=%d timeout=%u retry=%u rnr_retry=%u "
           "min_rnr=%u qp_state=%d\n", q, qps[q].qp->qp_num, r.sq_psn, r.dest_qp_num, r.rq_psn,
           128 << r.path_mtu, r.timeout, r.retry_cnt, r.rnr_retry, r.min_rnr_timer, r.qp_state);
}

/* The scatter/gather list of a command on its MR: sge=OFF:LEN,OFF:LEN,... or off= len=
 * (one entry). Returns NULL (and fills sg, n, total) or an error message. */
static const char *get_sges(int *m, struct ibv_sge *sg, int *n, uint64_t *total) {
    *m = (int)num("mr", 0);
    if (*m < 0 || *m >= MAXOBJ || !mrs[*m].mr) return "bad mr";
    *n = 0; *total = 0;
    if (!has("sge")) {
        uint64_t off = num("off", 0), len = num("len", 0);
        if (!get_mr(m, off, len)) return "bad mr or range";
        sg[0] = (struct ibv_sge){ .addr = (uintptr_t)mrs[*m].buf + off, .length = (uint32_t)len,
                                  .lkey = mrs[*m].mr->lkey };
        *n = 1; *total = len;
        return NULL;
    }
    const char *p = arg("sge");
    while (*p) {
        char *end;
        uint64_t off = strtoull(p, &end, 0), len;
        if (end == p || *end != ':') return "bad sge= (OFF:LEN,...)";
        p = end + 1;
        len = strtoull(p, &end, 0);
        if (end == p || (*end && *end != ',')) return "bad sge= (OFF:LEN,...)";
        p = *end ? end + 1 : end;
        if (*n >= MAXSGE) return "too many sge entries";
        if (!get_mr(m, off, len)) return "sge entry out of the mr";
        sg[*n] = (struct ibv_sge){ .addr = (uintptr_t)mrs[*m].buf + off, .length = (uint32_t)len,
                                   .lkey = mrs[*m].mr->lkey };
        (*n)++; *total += len;
    }
    if (!*n) return "empty sge=";
    return NULL;
}

/* write/read/fadd/cswap/send(_imm)/write_imm: one work request; write and send take a
 * gather list (sge=), the others one SGE (off= len=) */
static void cmd_post(enum ibv_wr_opcode op, int atomic) {
    int q, m, nsge = 1;
    uint64_t off = num("off", 0), len = atomic ? 8 : num("len", 0);
    struct ibv_sge sg[MAXSGE];
    if (!get_qp(&q)) ERR("bad qp");
    if (has("sge")) {
        const char *why;
        if (atomic || op == IBV_WR_RDMA_READ) ERR("sge= only with write/send");
        if ((why = get_sges(&m, sg, &nsge, &len))) ERR("%s", why);
    } else {
        if (!get_mr(&m, off, len)) ERR("bad mr or range");
        sg[0] = (struct ibv_sge){ .addr = (uintptr_t)mrs[m].buf + off, .length = (uint32_t)len,
                                  .lkey = mrs[m].mr->lkey };
    }
    if (atomic && (off % 8 || num("raddr", 0) % 8)) ERR("atomics need 8-byte alignment");
    struct ibv_send_wr wr = { .wr_id = num("wr", 0), .sg_list = sg, .num_sge = nsge, .opcode = op,
                              .send_flags = num("signaled", 1) ? IBV_SEND_SIGNALED : 0 }, *bad;
    if (op == IBV_WR_RDMA_WRITE_WITH_IMM || op == IBV_WR_SEND_WITH_IMM) NEED("imm");
    if (has("imm")) {
        if (op == IBV_WR_RDMA_WRITE) wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        else if (op == IBV_WR_SEND) wr.opcode = IBV_WR_SEND_WITH_IMM;
        else if (op != IBV_WR_RDMA_WRITE_WITH_IMM && op != IBV_WR_SEND_WITH_IMM)
            ERR("imm= only with write/send");
        wr.imm_data = htonl((uint32_t)num("imm", 0));      /* verbs: imm_data is big-endian */
    }
    if (atomic) {
        wr.wr.atomic.remote_addr = num("raddr", 0);
        wr.wr.atomic.rkey = (uint32_t)num("rkey", 0);
        wr.wr.atomic.compare_add = op == IBV_WR_ATOMIC_FETCH_AND_ADD ? num("add", 0) : num("cmp", 0);
        wr.wr.atomic.swap = num("swap", 0);
    } else if (op != IBV_WR_SEND && op != IBV_WR_SEND_WITH_IMM) {
        NEED("raddr"); NEED("rkey");
        wr.wr.rdma.remote_addr = num("raddr", 0);
        wr.wr.rdma.rkey = (uint32_t)num("rkey", 0);
    }
    int rc = ibv_post_send(qps[q].qp, &wr, &bad);
    if (rc) ERR("ibv_post_send: %s", strerror(rc));
    printf("ok wr=%llu\n", (unsigned long long)wr.wr_id);
}

/* recv: one receive work request with a scatter list (sge=) or one SGE (off= len=) */
static void cmd_recv(void) {
    int q, m, n;
    uint64_t total;
    struct ibv_sge sg[MAXSGE];
    const char *why;
    if (!get_qp(&q)) ERR("bad qp");
    if ((why = get_sges(&m, sg, &n, &total))) ERR("%s", why);
    struct ibv_recv_wr wr = { .wr_id = num("wr", 0), .sg_list = sg, .num_sge = n }, *bad;
    int rc = ibv_post_recv(qps[q].qp, &wr, &bad);
    if (rc) ERR("ibv_post_recv: %s", strerror(rc));
    printf("ok wr=%llu num_sge=%d len=%llu\n", (unsigned long long)wr.wr_id, n, (unsigned long long)total);
}

static const char *wc_opcode(enum ibv_wc_opcode op) {
    switch (op) {
    case IBV_WC_SEND: return "SEND";               case IBV_WC_RDMA_WRITE: return "RDMA_WRITE";
    case IBV_WC_RDMA_READ: return "RDMA_READ";     case IBV_WC_COMP_SWAP: return "COMP_SWAP";
    case IBV_WC_FETCH_ADD: return "FETCH_ADD";     case IBV_WC_RECV: return "RECV";
    case IBV_WC_RECV_RDMA_WITH_IMM: return "RECV_RDMA_WITH_IMM";
    default: return "OTHER";
    }
}

static const char *wc_status_name(enum ibv_wc_status st) {
    switch (st) {
#define S(x) case IBV_WC_##x: return "IBV_WC_" #x;
    S(SUCCESS) S(LOC_LEN_ERR) S(LOC_QP_OP_ERR) S(LOC_EEC_OP_ERR) S(LOC_PROT_ERR) S(WR_FLUSH_ERR)
    S(MW_BIND_ERR) S(BAD_RESP_ERR) S(LOC_ACCESS_ERR) S(REM_INV_REQ_ERR) S(REM_ACCESS_ERR)
    S(REM_OP_ERR) S(RETRY_EXC_ERR) S(RNR_RETRY_EXC_ERR) S(LOC_RDD_VIOL_ERR) S(REM_INV_RD_REQ_ERR)
    S(REM_ABORT_ERR) S(INV_EECN_ERR) S(INV_EEC_STATE_ERR) S(FATAL_ERR) S(RESP_TIMEOUT_ERR)
    S(GENERAL_ERR)
#undef S
    default: return "IBV_WC_UNKNOWN";
    }
}

static void cmd_poll(void) {
    int q;
    if (!get_qp(&q)) ERR("bad qp");
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long ms = (long)num("ms", 1000);
    for (;;) {
        struct ibv_wc wc;
        int n = ibv_poll_cq(qps[q].cq, 1, &wc);
        if (n < 0) ERR("ibv_poll_cq failed");
        if (n == 1) {
            char s[64];
            snprintf(s, sizeof s, "%s", ibv_wc_status_str(wc.status));
            for (char *p = s; *p; p++) if (*p == ' ') *p = '_';
            printf("ok wr=%llu status=%d status_str=%s status_name=%s opcode=%s opcode_num=%d byte_len=%u "
                   "qp_num=0x%x src_qp=0x%x wc_flags=0x%x with_imm=%d",
                   (unsigned long long)wc.wr_id, wc.status, s, wc_status_name(wc.status), wc_opcode(wc.opcode),
                   wc.opcode, wc.byte_len, wc.qp_num, wc.src_qp, wc.wc_flags, !!(wc.wc_flags & IBV_WC_WITH_IMM));
            if (wc.wc_flags & IBV_WC_WITH_IMM) printf(" imm=0x%x", ntohl(wc.imm_data));
            printf("\n");
            return;
        }
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 >= ms) break;
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    printf("ok empty\n");
}

static void cmd_wmem(void) {
    int m;
    const char *h = arg("hex") ? arg("hex") : "";
    size_t n = strlen(h) / 2;
    uint64_t off = num("off", 0);
    if (strlen(h) % 2) ERR("odd hex length");
    if (!get_mr(&m, off, n)) ERR("bad mr or range");
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(h + 2 * i, "%2x", &v) != 1) ERR("bad hex");
        mrs[m].buf[off + i] = (char)v;
    }
    printf("ok len=%zu\n", n);
}

static void cmd_rmem(void) {
    int m;
    uint64_t off = num("off", 0), len = num("len", 0);
    if (!get_mr(&m, off, len)) ERR("bad mr or range");
    if (len > 4096) ERR("len > 4096 per rmem");
    printf("ok len=%llu hex=", (unsigned long long)len);
    for (uint64_t i = 0; i < len; i++) printf("%02x", (unsigned char)mrs[m].buf[off + i]);
    printf("\n");
}

static void cmd_state(void) {
    int q;
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    if (!get_qp(&q)) ERR("bad qp");
    if (ibv_query_qp(qps[q].qp, &a, IBV_QP_STATE, &ia)) ERR("ibv_query_qp failed");
    printf("ok qp=%d state=%d\n", q, a.qp_state);
}

static void cmd_counters(void) {
    char dir[128], path[400];
    snprintf(dir, sizeof dir, "/sys/class/infiniband/%s/ports/1/hw_counters", ibv_get_device_name(ctx->device));
    DIR *d = opendir(dir);
    if (!d) ERR("no %s", dir);
    printf("ok");
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "lifespan")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "r");
        unsigned long long v;
        if (f && fscanf(f, "%llu", &v) == 1) printf(" %s=%llu", e->d_name, v);
        if (f) fclose(f);
    }
    closedir(d);
    printf("\n");
}

int main(int argc, char **argv) {
    char line[8192];
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 1) snprintf(netdev, sizeof netdev, "%s", argv[1]);
    if (setup()) return 1;
    while (fgets(line, sizeof line, stdin)) {
        char *save, *verb = strtok_r(line, " \t\r\n", &save), *tok;
        if (!verb) continue;
        nargs = 0;
        while ((tok = strtok_r(NULL, " \t\r\n", &save)) && nargs < MAXARG) {
            char *eq = strchr(tok, '=');
            if (!eq) continue;
            *eq = 0; keys[nargs] = tok; vals[nargs++] = eq + 1;
        }
        if (!strcmp(verb, "info")) cmd_info();
        else if (!strcmp(verb, "qp")) cmd_qp();
        else if (!strcmp(verb, "mr")) cmd_mr();
        else if (!strcmp(verb, "connect")) cmd_connect();
        else if (!strcmp(verb, "write")) cmd_post(IBV_WR_RDMA_WRITE, 0);
        else if (!strcmp(verb, "read")) cmd_post(IBV_WR_RDMA_READ, 0);
        else if (!strcmp(verb, "fadd")) cmd_post(IBV_WR_ATOMIC_FETCH_AND_ADD, 1);
        else if (!strcmp(verb, "cswap")) cmd_post(IBV_WR_ATOMIC_CMP_AND_SWP, 1);
        else if (!strcmp(verb, "write_imm")) cmd_post(IBV_WR_RDMA_WRITE_WITH_IMM, 0);
        else if (!strcmp(verb, "send")) cmd_post(IBV_WR_SEND, 0);
        else if (!strcmp(verb, "send_imm")) cmd_post(IBV_WR_SEND_WITH_IMM, 0);
        else if (!strcmp(verb, "recv")) cmd_recv();
        else if (!strcmp(verb, "poll")) cmd_poll();
        else if (!strcmp(verb, "wmem")) cmd_wmem();
        else if (!strcmp(verb, "rmem")) cmd_rmem();
        else if (!strcmp(verb, "state")) cmd_state();
        else if (!strcmp(verb, "counters")) cmd_counters();
        else if (!strcmp(verb, "quit")) { printf("ok bye\n"); break; }
        else printf("err unknown command %s\n", verb);
    }
    return 0;
}
