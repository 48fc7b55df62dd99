/* One HTTP/1.1 client on one keep-alive connection, timing each request: the REST
 * figures of bench/serving_bench.py without a Python client's own time in them.
 *
 *     latency_client HOST PORT METHOD PATH BODY_FILE WARMUP N
 *
 * BODY_FILE is the request body (`-` for none: a GET). The client connects once (with
 * TCP_NODELAY, as the Python clients do), sends WARMUP requests untimed, then N timed
 * ones, one at a time: write the whole request in one send, read the answer's headers
 * and Content-Length bytes of body, check the status is 200. It prints the N times in
 * seconds as one JSON list on stdout; anything else (a refused connection, a status
 * other than 200, a closed connection, an answer without Content-Length) is one line on
 * stderr and exit status 1.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define ANSWER_LIMIT (16 * 1024 * 1024)

static char *answer;
static size_t have;  /* bytes of answer read and not yet used */

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

static void fill(int fd) {
    if (have >= ANSWER_LIMIT)
        fail("answer too large");
    ssize_t n = recv(fd, answer + have, ANSWER_LIMIT - have, 0);
    if (n <= 0)
        fail("the server closed the connection");
    have += (size_t)n;
}

/* One answer: its status; its bytes are dropped from the buffer. */
static int one_answer(int fd) {
    char *end;
    for (;;) {
        answer[have] = '\0';
        end = have >= 4 ? memmem(answer, have, "\r\n\r\n", 4) : NULL;
        if (end)
            break;
        fill(fd);
    }
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
    while (have < head + (size_t)length)
        fill(fd);
    have -= head + (size_t)length;
    memmove(answer, answer + head + length, have);
    return status;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 8)
        fail("usage: latency_client HOST PORT METHOD PATH BODY_FILE WARMUP N");
    size_t body_len;
    char *body = read_file(argv[5], &body_len);
    int warmup = atoi(argv[6]), n = atoi(argv[7]);
    char head[1024];
    int head_len = body ? snprintf(head, sizeof head,
                                   "%s %s HTTP/1.1\r\nhost: %s:%s\r\ncontent-type: "
                                   "application/json\r\ncontent-length: %zu\r\n\r\n",
                                   argv[3], argv[4], argv[1], argv[2], body_len)
                        : snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nhost: %s:%s\r\n\r\n",
                                   argv[3], argv[4], argv[1], argv[2]);
    if (head_len <= 0 || head_len >= (int)sizeof head)
        fail("request line too long");
    size_t request_len = (size_t)head_len + body_len;
    char *request = malloc(request_len);
    answer = malloc(ANSWER_LIMIT + 1);
    double *times = malloc(sizeof(double) * (n > 0 ? n : 1));
    if (!request || !answer || !times)
        fail("out of memory");
    memcpy(request, head, (size_t)head_len);
    if (body_len)
        memcpy(request + head_len, body, body_len);

    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    if (inet_pton(AF_INET, argv[1], &addr.sin_addr) != 1)
        fail("HOST must be an IPv4 address");
    int fd = socket(AF_INET, SOCK_STREAM, IPPROTO_TCP);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0)
        fail("cannot connect");
    for (int i = 0; i < warmup + n; i++) {
        double t0 = now();
        send_all(fd, request, request_len);
        int status = one_answer(fd);
        double took = now() - t0;
        if (status != 200) {
            fprintf(stderr, "latency_client: status %d\n", status);
            return 1;
        }
        if (i >= warmup)
            times[i - warmup] = took;
    }
    close(fd);
    printf("[");
    for (int i = 0; i < n; i++)
        printf(i ? ", %.9f" : "%.9f", times[i]);
    printf("]\n");
    return 0;
}
