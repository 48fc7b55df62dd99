/* One HTTP/1.1 client on one keep-alive connection, timing each request: the REST
 * figures of bench/serving_bench.py without a Python client's own time in them.
 *
 *     latency_client HOST PORT METHOD PATH BODY_FILE WARMUP N [CLIENTS SECONDS]
 *
 * BODY_FILE is the request body (`-` for none: a GET). The client connects once (with
 * TCP_NODELAY, as the Python clients do), sends WARMUP requests untimed, then N timed
 * ones, one at a time: write the whole request in one send, read the answer's headers
 * and Content-Length bytes of body, check the status is 200. It prints the N times in
 * seconds as one JSON list on stdout. With CLIENTS and SECONDS, CLIENTS threads, each
 * on a connection of its own, send WARMUP requests each, meet, then send one at a time
 * for SECONDS; it prints {"times": [...], "wall": s}. Anything else (a refused
 * connection, a status other than 200, a closed connection, an answer without
 * Content-Length) is one line on stderr and exit status 1.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define ANSWER_LIMIT (16 * 1024 * 1024)

/* one client's connection and what it has read and not yet used */
struct conn {
    int fd;
    char *answer;
    size_t have;
};

static void fail(const char *what) {
    fprintf(stderr, "latency_client: %s\n", what);
    exit(1);
}

static char *read_file(const char *path, size_t *len) {
    *len = 0;
    if (strcmp(path, "-") == 0)
        return NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        fail("cannot open the body file");
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *data = malloc(size > 0 ? size : 1);
    if (!data || fread(data, 1, size, f) != (size_t)size)
        fail("cannot read the body file");
    fclose(f);
    *len = (size_t)size;
    return data;
}

static void send_all(int fd, const char *data, size_t len) {
    while (len > 0) {
        ssize_t n = send(fd, data, len, 0);
        if (n <= 0)
            fail("send failed");
        data += n;
        len -= (size_t)n;
    }
}

static void fill(struct conn *c) {
    if (c->have >= ANSWER_LIMIT)
        fail("answer too large");
    ssize_t n = recv(c->fd, c->answer + c->have, ANSWER_LIMIT - c->have, 0);
    if (n <= 0)
        fail("the server closed the connection");
    c->have += (size_t)n;
}

/* One answer: its status; its bytes are dropped from the buffer. */
static int one_answer(struct conn *c) {
    char *end;
    for (;;) {
        c->answer[c->have] = '\0';
        end = c->have >= 4 ? memmem(c->answer, c->have, "\r\n\r\n", 4) : NULL;
        if (end)
            break;
        fill(c);
    }
    char *answer = c->answer;
    size_t head = (size_t)(end - answer) + 4;
    int status = 0;
    if (sscanf(answer, "HTTP/1.%*d %d", &status) != 1)
        fail("not an HTTP answer");
    long length = -1;
    for (char *line = strstr(answer, "\r\n"); line && line < end; line = strstr(line + 2, "\r\n"))
        if (strncasecmp(line + 2, "content-length:", 15) == 0)
            length = strtol(line + 17, NULL, 10);
    if (length < 0)
        fail("an answer without Content-Length");
    while (c->have < head + (size_t)length)
        fill(c);
    c->have -= head + (size_t)length;
    memmove(answer, answer + head + length, c->have);
    return status;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static char *request;
static size_t request_len;
static struct sockaddr_in addr;

static void open_conn(struct conn *c) {
    c->answer = malloc(ANSWER_LIMIT + 1);
    c->have = 0;
    if (!c->answer)
        fail("out of memory");
    c->fd = socket(AF_INET, SOCK_STREAM, IPPROTO_TCP);
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(c->fd, (struct sockaddr *)&addr, sizeof addr) != 0)
        fail("cannot connect");
}

static double one_request(struct conn *c) {
    double t0 = now();
    send_all(c->fd, request, request_len);
    int status = one_answer(c);
    double took = now() - t0;
    if (status != 200) {
        fprintf(stderr, "latency_client: status %d\n", status);
        exit(1);
    }
    return took;
}

/* the threads' shared state in the CLIENTS mode */
static int warmup, clients, ready;
static double seconds, start_at = -1;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t met = PTHREAD_COND_INITIALIZER;

struct run {
    double *times;
    size_t count, room;
};

static void *client_loop(void *arg) {
    struct run *r = arg;
    struct conn c;
    open_conn(&c);
    for (int i = 0; i < warmup; i++)
        one_request(&c);
    pthread_mutex_lock(&lock);
    if (++ready == clients) {
        start_at = now();
        pthread_cond_broadcast(&met);
    }
    while (start_at < 0)
        pthread_cond_wait(&met, &lock);
    double end = start_at + seconds;
    pthread_mutex_unlock(&lock);
    while (now() < end) {
        if (r->count == r->room) {
            r->room = r->room ? 2 * r->room : 1024;
            r->times = realloc(r->times, sizeof(double) * r->room);
            if (!r->times)
                fail("out of memory");
        }
        r->times[r->count++] = one_request(&c);
    }
    close(c.fd);
    return NULL;
}

static void print_list(const double *times, size_t n) {
    printf("[");
    for (size_t i = 0; i < n; i++)
        printf(i ? ", %.9f" : "%.9f", times[i]);
    printf("]");
}

int main(int argc, char **argv) {
    if (argc != 8 && argc != 10)
        fail("usage: latency_client HOST PORT METHOD PATH BODY_FILE WARMUP N "
             "[CLIENTS SECONDS]");
    size_t body_len;
    char *body = read_file(argv[5], &body_len);
    warmup = atoi(argv[6]);
    int n = atoi(argv[7]);
    char head[1024];
    int head_len = body ? snprintf(head, sizeof head,
                                   "%s %s HTTP/1.1\r\nhost: %s:%s\r\ncontent-type: "
                                   "application/json\r\ncontent-length: %zu\r\n\r\n",
                                   argv[3], argv[4], argv[1], argv[2], body_len)
                        : snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nhost: %s:%s\r\n\r\n",
                                   argv[3], argv[4], argv[1], argv[2]);
    if (head_len <= 0 || head_len >= (int)sizeof head)
        fail("request line too long");
    request_len = (size_t)head_len + body_len;
    request = malloc(request_len);
    if (!request)
        fail("out of memory");
    memcpy(request, head, (size_t)head_len);
    if (body_len)
        memcpy(request + head_len, body, body_len);
    addr.sin_family = AF_INET;
    addr.sin_port = htons(atoi(argv[2]));
    if (inet_pton(AF_INET, argv[1], &addr.sin_addr) != 1)
        fail("HOST must be an IPv4 address");

    if (argc == 8) {
        double *times = malloc(sizeof(double) * (n > 0 ? n : 1));
        if (!times)
            fail("out of memory");
        struct conn c;
        open_conn(&c);
        for (int i = 0; i < warmup + n; i++) {
            double took = one_request(&c);
            if (i >= warmup)
                times[i - warmup] = took;
        }
        close(c.fd);
        print_list(times, (size_t)n);
        printf("\n");
        return 0;
    }
    clients = atoi(argv[8]);
    seconds = atof(argv[9]);
    if (clients < 1 || seconds <= 0)
        fail("CLIENTS and SECONDS must be positive");
    pthread_t *threads = calloc((size_t)clients, sizeof(pthread_t));
    struct run *runs = calloc((size_t)clients, sizeof(struct run));
    if (!threads || !runs)
        fail("out of memory");
    for (int i = 0; i < clients; i++)
        if (pthread_create(&threads[i], NULL, client_loop, &runs[i]) != 0)
            fail("cannot start a thread");
    for (int i = 0; i < clients; i++)
        pthread_join(threads[i], NULL);
    double wall = now() - start_at;
    printf("{\"times\": [");
    int first = 1;
    for (int i = 0; i < clients; i++)
        for (size_t k = 0; k < runs[i].count; k++, first = 0)
            printf(first ? "%.9f" : ", %.9f", runs[i].times[k]);
    printf("], \"wall\": %.6f}\n", wall);
    return 0;
}
