/* sandbox-launch: the first hop of a sandbox's launch, and the sandbox's pid 1 (sandboxes/bwrap.py).
 *
 *   sandbox-launch [--join FILE]... [--rlimit RESOURCE VALUE]... [--ids UID GID] -- PROGRAM ARG...
 *   sandbox-launch --init -- COMMAND ARG...          (inside the sandbox, as its pid 1)
 *   sandbox-launch --init-wait FD                    (the same, with the command read from FD)
 *   sandbox-launch [--join FILE]... [--rlimit ...] [--ids UID GID] --native -- BWRAP ARG...
 *                                                    (the sandbox set up here, not by bwrap)
 *
 * In this order: writes "0" (itself) into each cgroup join FILE, sets each limit (soft = hard),
 * drops to UID/GID with no supplementary groups, checks the drop cannot be undone, and execs
 * PROGRAM (an absolute path: no PATH search, and the environment passes through untouched).
 * Any step that fails stops the launch before PROGRAM starts: a message on stderr, exit 125.
 *
 * It replaces `/bin/sh -c 'echo 0 >tasks; ulimit ...; exec "$@"'` followed by setpriv: the
 * same steps in the same order, in one small statically linked exec instead of two
 * dynamically linked ones (each loads libc and, for setpriv, libcap-ng and its locale).
 *
 * With --native (``SANDBOXES_LAUNCHER=native``), PROGRAM is not executed: its arguments, the
 * subset of bwrap's that sandboxes/bwrap.py writes, are carried out here, in bwrap's order and
 * with bwrap's flags (see native() below), and the command after bwrap's "--" is executed as the
 * sandbox's pid 1. One static exec instead of bwrap's dynamically linked one, and no parse of
 * /proc/self/mountinfo per bind (bind flags are set on the whole tree with mount_setattr).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

static void fail(const char *what, const char *arg) {
    fprintf(stderr, "sandbox-launch: %s %s: %s\n", what, arg ? arg : "", strerror(errno));
    _exit(125);
}

static unsigned long long number(const char *text) {
    char *end = NULL;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno || !end || *end || !*text || text[0] == '-') {
        errno = EINVAL;
        fail("not a number:", text);
    }
    return value;
}

/* The sandbox's pid 1, as `sh -c "trap '' INT QUIT; (\"$@\")"` was (and as the supervisor
 * starts a command, sandboxes/inside.py): SIGINT and SIGQUIT ignored, for the command too; the
 * command in a child (never pid 1 itself); every orphan reaped while it runs; the shell's note
 * when it dies of a signal ("Terminated", "Segmentation fault (core dumped)"; not for SIGINT or
 * SIGPIPE) and its status (128 + signal); a command that cannot start gets the shell's message
 * and status (127 not found, 126 otherwise). When this exits, the kernel kills the rest of the
 * pid namespace. One static exec instead of the shell's dynamically linked one. */
static int init(char **command, char **env, const char *cwd, int stdin_fd) {
    signal(SIGINT, SIG_IGN);
    signal(SIGQUIT, SIG_IGN);
    pid_t child = fork();
    if (child < 0) {
        perror("sandbox-init: fork");
        return 2;
    }
    if (child > 0 && stdin_fd >= 0)
        close(stdin_fd); /* the command's alone */
    if (child == 0) {
        if (env)
            environ = env; /* before execvp: its PATH search reads this environment */
        if (cwd && chdir(cwd) != 0) {
            fprintf(stderr, "sandbox-init: cannot change directory to %s: %s\n", cwd,
                    strerror(errno));
            _exit(125);
        }
        if (stdin_fd >= 0 && dup2(stdin_fd, 0) != 0) {
            perror("sandbox-init: stdin");
            _exit(125);
        }
        /* execvp: PATH search, EACCES remembered while later directories are tried, and a
         * file without #! run by /bin/sh, as the shell does. */
        execvp(command[0], command);
        int e = errno;
        int missing = e == ENOENT || e == ENOTDIR;
        fprintf(stderr, "sandbox-init: 1: %s: %s\n", command[0],
                missing ? "not found" : strerror(e));
        _exit(missing || e == ELOOP || e == ENAMETOOLONG ? 127 : 126);
    }
    for (;;) {
        int status;
        pid_t done = wait(&status);
        if (done < 0) {
            if (errno == EINTR)
                continue;
            return 2;
        }
        if (done != child)
            continue; /* an orphan, reaped */
        if (WIFEXITED(status))
            return WEXITSTATUS(status);
        int sig = WTERMSIG(status);
        if (sig != SIGINT && sig != SIGPIPE) {
            const char *name = strsignal(sig);
            fprintf(stderr, "%s%s\n", name ? name : "Unknown signal",
                    WCOREDUMP(status) ? " (core dumped)" : "");
        }
        return 128 + sig;
    }
}

/* A sandbox started ahead of its first command (sandboxes/bwrap.py, ``Prestarted``): pid 1
 * waits on the unix stream socket FD for the command, then runs it as init() does. The
 * message: an 8-byte length (native order), carrying the command's stdin as an SCM_RIGHTS
 * descriptor when it has one (else the command keeps this process's stdin, /dev/null), then
 * that many bytes of NUL-terminated fields: the working directory, the number of environment
 * entries, the entries, the argv. A length, not EOF, ends the message: a copy of the host's
 * end in a process the host forked must not keep the command waiting. EOF before a message
 * (the host gave the sandbox up) ends this process. Nothing but it runs in the sandbox until
 * then; FD is closed before the command starts. */
static int read_fully(int fd, char *buffer, size_t size) {
    size_t done = 0;
    while (done < size) {
        ssize_t got = read(fd, buffer + done, size - done);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return -1;
        done += (size_t)got;
    }
    return 0;
}

static int malformed(void) {
    fprintf(stderr, "sandbox-init: malformed command\n");
    return 125;
}

static int init_wait(const char *fd_text) {
    int sock = (int)number(fd_text);
    unsigned long long length = 0;
    char control[CMSG_SPACE(sizeof(int))];
    struct iovec header = {&length, sizeof(length)};
    struct msghdr hello = {0};
    hello.msg_iov = &header;
    hello.msg_iovlen = 1;
    hello.msg_control = control;
    hello.msg_controllen = sizeof(control);
    ssize_t got;
    do
        got = recvmsg(sock, &hello, MSG_CMSG_CLOEXEC);
    while (got < 0 && errno == EINTR);
    if (got == 0)
        return 0; /* given up: no command */
    if (got < 0) {
        perror("sandbox-init: recvmsg");
        return 125;
    }
    int stdin_fd = -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&hello); c; c = CMSG_NXTHDR(&hello, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
            c->cmsg_len == CMSG_LEN(sizeof(int)))
            memcpy(&stdin_fd, CMSG_DATA(c), sizeof(int));
    if ((size_t)got < sizeof(length) &&
        read_fully(sock, (char *)&length + got, sizeof(length) - (size_t)got) != 0)
        return malformed();
    if (length == 0 || length > (1ULL << 30))
        return malformed();
    char *message = malloc(length);
    if (!message || read_fully(sock, message, length) != 0 || message[length - 1] != '\0')
        return malformed();
    close(sock);
    size_t fields = 0;
    for (size_t k = 0; k < length; k++)
        fields += message[k] == '\0';
    char **field = calloc(fields + 1, sizeof(char *));
    if (!field || fields < 3)
        return malformed();
    for (size_t k = 0, start = 0; k < fields; k++) {
        field[k] = message + start;
        start += strlen(field[k]) + 1;
    }
    unsigned long long count = number(field[1]);
    if (count > fields - 3) /* not count + 3 > fields: a count near 2^64 would wrap past it */
        return malformed();
    char **env = calloc(count + 1, sizeof(char *));
    if (!env) {
        perror("sandbox-init: environment");
        return 125;
    }
    for (size_t k = 0; k < count; k++)
        env[k] = field[2 + k];
    return init(field + 2 + count, env, field[0], stdin_fd);
}

/* ---- --native: the sandbox set up here, as bwrap 0.8 does for the flags we pass ------------ */
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/mount.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#define MAX_OPS 128
enum op_kind { OP_BIND, OP_RO_BIND, OP_RO_BIND_TRY, OP_SYMLINK, OP_DIR, OP_PROC, OP_DEV,
               OP_REMOUNT_RO };
struct op {
    enum op_kind kind;
    const char *source; /* host path (binds, resolved), or a symlink's target */
    const char *dest;   /* path in the sandbox */
};

static void native_fail(const char *what, const char *arg) {
    fprintf(stderr, "sandbox-launch: native: %s %s: %s\n", what, arg ? arg : "", strerror(errno));
    _exit(125);
}

static void write_text(int dir_fd, const char *path, const char *text) {
    int fd = openat(dir_fd, path, O_WRONLY | O_CLOEXEC);
    size_t length = strlen(text);
    if (fd < 0 || write(fd, text, length) != (ssize_t)length)
        native_fail("cannot write", path);
    close(fd);
}

/* The user namespace's maps: INSIDE is OUTSIDE of the parent namespace (one id each). Through
 * the host's /proc, opened before any mount moved (the sandbox may have no /proc). */
static void map_ids(int proc_fd, unsigned inside_uid, unsigned outside_uid, unsigned inside_gid,
                    unsigned outside_gid) {
    char line[64];
    write_text(proc_fd, "self/setgroups", "deny");
    snprintf(line, sizeof line, "%u %u 1\n", inside_uid, outside_uid);
    write_text(proc_fd, "self/uid_map", line);
    snprintf(line, sizeof line, "%u %u 1\n", inside_gid, outside_gid);
    write_text(proc_fd, "self/gid_map", line);
}

/* A directory that is there and is no symlink (lstat: a link is not followed). */
static int is_real_dir(const char *path) {
    struct stat info;
    return lstat(path, &info) == 0 && S_ISDIR(info.st_mode);
}

/* mkdir -p of PATH's parents (0755, as bwrap's mkdir_with_parents), except that a parent that
 * is a symlink stops the launch: bwrap follows it, and an absolute link then resolves in the
 * set-up root, where /oldroot is the host's whole tree (a link that a run left in a writable
 * bind would have the set-up make directories, or mount, on the host's side of it). */
static void make_parents(char *path) {
    for (char *slash = strchr(path + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
        *slash = '\0';
        if (mkdir(path, 0755) != 0 && !(errno == EEXIST && is_real_dir(path))) {
            if (errno == EEXIST)
                errno = ELOOP;
            native_fail("cannot make directory", path);
        }
        *slash = '/';
    }
}

/* A destination in the sandbox: absolute, with no empty, "." or ".." component (bwrap puts
 * any string after "/newroot/"; "/../x" or a relative one would land outside the new root). */
static int clean_dest(const char *dest) {
    if (dest[0] != '/')
        return 0;
    if (dest[1] == '\0')
        return 1; /* "/" itself */
    for (const char *part = dest + 1;; ) {
        const char *end = strchr(part, '/');
        size_t length = end ? (size_t)(end - part) : strlen(part);
        if (length == 0 || (length == 1 && part[0] == '.') ||
            (length == 2 && part[0] == '.' && part[1] == '.'))
            return 0;
        if (!end)
            return 1;
        part = end + 1;
    }
}

static char *join(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *out = malloc(la + lb + 1);
    if (!out)
        native_fail("out of memory", NULL);
    memcpy(out, a, la);
    memcpy(out + la, b, lb + 1);
    return out;
}

/* A recursive bind of SOURCE on DEST with ATTR on every mount of the tree (bwrap's bind_mount:
 * MS_BIND|MS_REC, then each mount of it remounted nosuid, nodev unless devices, read-only when
 * asked; here in one mount_setattr instead of a remount per line of /proc/self/mountinfo). */
static void bind_tree(const char *source, const char *dest, unsigned long long attr) {
    int tree = (int)syscall(SYS_open_tree, AT_FDCWD, source,
                            OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
    if (tree < 0)
        native_fail("cannot bind", source);
    struct mount_attr set = {.attr_set = attr};
    if (syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH | AT_RECURSIVE, &set, sizeof set) != 0)
        native_fail("cannot set the flags of", dest);
    if (syscall(SYS_move_mount, tree, "", AT_FDCWD, dest, MOVE_MOUNT_F_EMPTY_PATH) != 0)
        native_fail("cannot mount on", dest);
    close(tree);
}

/* Both refuse a symlink at PATH itself, for the reason make_parents gives. */
static void ensure_dir(const char *path) {
    if (mkdir(path, 0755) != 0 && !(errno == EEXIST && is_real_dir(path))) {
        if (errno == EEXIST)
            errno = ELOOP;
        native_fail("cannot make directory", path);
    }
}

static void ensure_file(const char *path) {
    struct stat info;
    if (lstat(path, &info) == 0) {
        if (S_ISLNK(info.st_mode)) {
            errno = ELOOP;
            native_fail("cannot make file", path);
        }
        if (!S_ISDIR(info.st_mode))
            return;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0)
        native_fail("cannot make file", path);
    close(fd);
}

#define RO_ATTR (MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)
#define RW_ATTR (MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)

/* One op, with the host's tree at /oldroot and the sandbox's at /newroot (as in bwrap's
 * setup_newroot). */
static void run_op(const struct op *op) {
    char *dest = join("/newroot", op->dest);
    make_parents(dest);
    switch (op->kind) {
    case OP_BIND:
    case OP_RO_BIND:
    case OP_RO_BIND_TRY: {
        char *source = join("/oldroot", op->source);
        struct stat info;
        if (stat(source, &info) != 0)
            native_fail("cannot find", op->source);
        if (S_ISDIR(info.st_mode))
            ensure_dir(dest);
        else
            ensure_file(dest);
        bind_tree(source, dest, op->kind == OP_BIND ? RW_ATTR : RO_ATTR);
        free(source);
        break;
    }
    case OP_SYMLINK:
        if (symlink(op->source, dest) != 0)
            native_fail("cannot make symlink", op->dest);
        break;
    case OP_DIR:
        ensure_dir(dest);
        break;
    case OP_PROC: {
        ensure_dir(dest);
        if (mount("proc", dest, "proc", MS_NOSUID | MS_NOEXEC | MS_NODEV, NULL) != 0)
            native_fail("cannot mount proc on", op->dest);
        /* bwrap covers these read-only (sysrq-trigger, say, could shut the machine down). */
        static const char *const covered[] = {"sys", "sysrq-trigger", "irq", "bus"};
        for (size_t k = 0; k < sizeof covered / sizeof *covered; k++) {
            char *sub = join(dest, "/");
            char *path = join(sub, covered[k]);
            if (access(path, W_OK) == 0)
                bind_tree(path, path, RO_ATTR);
            else if (errno != EACCES && errno != ENOENT && errno != EROFS)
                native_fail("cannot access", path);
            free(sub);
            free(path);
        }
        break;
    }
    case OP_DEV: {
        ensure_dir(dest);
        if (mount("tmpfs", dest, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755") != 0)
            native_fail("cannot mount a tmpfs on", op->dest);
        static const char *const nodes[] = {"null", "zero", "full", "random", "urandom", "tty"};
        for (size_t k = 0; k < sizeof nodes / sizeof *nodes; k++) {
            char *sub = join(dest, "/");
            char *node = join(sub, nodes[k]);
            char *source = join("/oldroot/dev/", nodes[k]);
            int fd = open(node, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
            if (fd < 0)
                native_fail("cannot make file", node);
            close(fd);
            bind_tree(source, node, MOUNT_ATTR_NOSUID); /* devices: no nodev */
            free(sub);
            free(node);
            free(source);
        }
        static const char *const links[][2] = {
            {"/proc/self/fd/0", "stdin"}, {"/proc/self/fd/1", "stdout"},
            {"/proc/self/fd/2", "stderr"}, {"/proc/self/fd", "fd"},
            {"/proc/kcore", "core"}, {"pts/ptmx", "ptmx"}};
        for (size_t k = 0; k < sizeof links / sizeof *links; k++) {
            char *sub = join(dest, "/");
            char *link = join(sub, links[k][1]);
            if (symlink(links[k][0], link) != 0)
                native_fail("cannot make symlink", link);
            free(sub);
            free(link);
        }
        char *shm = join(dest, "/shm");
        char *pts = join(dest, "/pts");
        if (mkdir(shm, 0755) != 0 || mkdir(pts, 0755) != 0)
            native_fail("cannot make directory", pts);
        if (mount("devpts", pts, "devpts", MS_NOSUID | MS_NOEXEC,
                  "newinstance,ptmxmode=0666,mode=620") != 0)
            native_fail("cannot mount devpts on", pts);
        free(shm);
        free(pts);
        break;
    }
    case OP_REMOUNT_RO: {
        /* Not recursive, like bwrap's: the mount at DEST only, its other flags kept. */
        struct mount_attr set = {.attr_set = RO_ATTR};
        if (syscall(SYS_mount_setattr, AT_FDCWD, dest, AT_SYMLINK_NOFOLLOW, &set, sizeof set) != 0)
            native_fail("cannot make read-only", op->dest);
        break;
    }
    }
    free(dest);
}

static void drop_capabilities(void) {
    for (int cap = 0; cap <= 63; cap++)
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL)
            native_fail("cannot drop a capability from the bounding set", NULL);
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL)
        native_fail("cannot clear ambient capabilities", NULL);
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    if (syscall(SYS_capset, &header, data) != 0)
        native_fail("cannot drop capabilities", NULL);
}

static int write_status(int fd, const char *key, long value) {
    char line[64];
    int length = snprintf(line, sizeof line, "{ \"%s\": %ld }\n", key, value);
    return write(fd, line, (size_t)length) == length ? 0 : -1;
}

static int is_flag(const char *arg, const char *name) { return strcmp(arg, name) == 0; }

static int descriptor(const char *text) {
    unsigned long long fd = number(text);
    if (fd > INT_MAX) { /* not one that (int) would turn into another, such as 1 */
        errno = EBADF;
        native_fail("not a descriptor:", text);
    }
    return (int)fd;
}

/* ARGS: bwrap's arguments after its path, ending in "-- COMMAND...". */
static int native(char **args) {
    static struct op ops[MAX_OPS];
    size_t count = 0;
    int unshared = 0, as_pid_1 = 0, die_with_parent = 0, new_session = 0, disable_userns = 0;
    int status_fd = -1, seccomp_fd = -1;
    const char *hostname = NULL, *cwd = NULL;
    char **command = NULL;
    clearenv(); /* the launch's own fixed environment never reaches the sandbox */
    for (size_t k = 0; args[k]; k++) {
        const char *a = args[k];
        int more = 0;
        for (; args[k + 1 + more] && more < 2; more++)
            ;
        if (is_flag(a, "--")) {
            command = args + k + 1;
            break;
        }
        static const char *const namespaces[] = {"--unshare-user", "--unshare-pid",
                                                 "--unshare-ipc", "--unshare-uts",
                                                 "--unshare-net", "--unshare-cgroup-try"};
        int known = 0;
        for (int n = 0; n < 6; n++)
            if (is_flag(a, namespaces[n])) {
                unshared |= 1 << n; /* each one, not a count: a repeated flag is no other */
                known = 1;
            }
        if (known)
            continue;
        if (is_flag(a, "--as-pid-1"))
            as_pid_1 = 1;
        else if (is_flag(a, "--die-with-parent"))
            die_with_parent = 1;
        else if (is_flag(a, "--new-session"))
            new_session = 1;
        else if (is_flag(a, "--disable-userns"))
            disable_userns = 1;
        else if (is_flag(a, "--clearenv"))
            clearenv();
        /* Each of these once: bwrap keeps the last, and an earlier descriptor, never closed,
         * would reach the sandbox's command. */
        else if (is_flag(a, "--hostname") && more >= 1 && !hostname)
            hostname = args[++k];
        else if (is_flag(a, "--chdir") && more >= 1 && !cwd)
            cwd = args[++k];
        else if (is_flag(a, "--json-status-fd") && more >= 1 && status_fd < 0)
            status_fd = descriptor(args[++k]);
        else if (is_flag(a, "--seccomp") && more >= 1 && seccomp_fd < 0)
            seccomp_fd = descriptor(args[++k]);
        else if (is_flag(a, "--setenv") && more >= 2) {
            if (setenv(args[k + 1], args[k + 2], 1) != 0)
                native_fail("cannot set", args[k + 1]);
            k += 2;
        } else if (count < MAX_OPS && more >= 1 && /* past MAX_OPS: refused below */
                   (is_flag(a, "--proc") || is_flag(a, "--dev") || is_flag(a, "--dir") ||
                    is_flag(a, "--remount-ro"))) {
            ops[count].kind = is_flag(a, "--proc") ? OP_PROC
                              : is_flag(a, "--dev") ? OP_DEV
                              : is_flag(a, "--dir") ? OP_DIR
                                                    : OP_REMOUNT_RO;
            ops[count++].dest = args[++k];
        } else if (count < MAX_OPS && more >= 2 &&
                   (is_flag(a, "--bind") || is_flag(a, "--ro-bind") ||
                    is_flag(a, "--ro-bind-try") || is_flag(a, "--symlink"))) {
            struct op *op = &ops[count];
            op->kind = is_flag(a, "--bind")      ? OP_BIND
                       : is_flag(a, "--ro-bind") ? OP_RO_BIND
                       : is_flag(a, "--symlink") ? OP_SYMLINK
                                                 : OP_RO_BIND_TRY;
            op->source = args[k + 1];
            op->dest = args[k + 2];
            k += 2;
            if (op->kind != OP_SYMLINK) {
                /* Resolved on the host, before any mount moves (bwrap's resolve_symlinks). */
                char *real = realpath(op->source, NULL);
                if (!real) {
                    if (op->kind == OP_RO_BIND_TRY && (errno == ENOENT || errno == ENOTDIR))
                        continue;
                    native_fail("cannot find", op->source);
                }
                op->source = real;
            }
            count++;
        } else {
            errno = EINVAL;
            native_fail("unsupported bwrap argument", a);
        }
    }
    for (size_t n = 0; n < count; n++)
        if (!clean_dest(ops[n].dest)) {
            errno = EINVAL;
            native_fail("not a clean absolute destination:", ops[n].dest);
        }
    /* Every namespace, and the command as pid 1: what bwrap.py always asks for. Anything
     * less is a call this launch was not written for. */
    if (!command || !command[0] || unshared != 0x3f || !as_pid_1 || !hostname) {
        errno = EINVAL;
        native_fail("needs every --unshare-*, --as-pid-1, --hostname and a command", NULL);
    }
    if (die_with_parent && prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
        native_fail("cannot die with parent", NULL);
    uid_t uid = getuid();
    gid_t gid = getgid();
    /* As after bwrap's exec: our own /proc/self files, for the maps below (dropping from root
     * made this process non-dumpable, and its /proc files root's). */
    if (prctl(PR_SET_DUMPABLE, 1) != 0 || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        native_fail("cannot set process flags", NULL);
    int proc_fd = open("/proc", O_PATH | O_DIRECTORY | O_CLOEXEC);
    int ready[2];
    if (proc_fd < 0 || pipe2(ready, O_CLOEXEC) != 0)
        native_fail("cannot open", "/proc");
    long pid = syscall(SYS_clone, CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET |
                                      CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP | SIGCHLD,
                       0, 0, 0, 0);
    if (pid < 0)
        native_fail("cannot make the namespaces", NULL);
    if (pid > 0) {
        /* The monitor, outside: bwrap's parent. "child-pid" once the sandbox is set up (a set-up
         * that failed leaves it out, and the host reports the error), "exit-code" at the end,
         * and pid 1's status as ours (128 + signal when killed). */
        close(ready[1]);
        close(proc_fd);
        if (seccomp_fd >= 0)
            close(seccomp_fd);
        prctl(PR_SET_DUMPABLE, 0); /* the maps are written: nobody of our uid may trace this */
        char byte;
        ssize_t got;
        do
            got = read(ready[0], &byte, 1);
        while (got < 0 && errno == EINTR);
        close(ready[0]);
        if (got == 1 && status_fd >= 0)
            write_status(status_fd, "child-pid", pid);
        int wstatus;
        while (waitpid((pid_t)pid, &wstatus, 0) < 0)
            if (errno != EINTR)
                native_fail("cannot wait for the sandbox", NULL);
        int code = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
        if (got == 1 && status_fd >= 0)
            write_status(status_fd, "exit-code", code);
        return code;
    }
    /* pid 1 of the new namespaces, with every capability in its new user namespace. */
    close(ready[0]);
    if (status_fd >= 0)
        close(status_fd);
    /* As bwrap with --dev: our id is 0 here (devpts needs root mapped); the sandbox's own ids
     * come with the second user namespace below. */
    map_ids(proc_fd, 0, uid, 0, gid);
    if (hostname && sethostname(hostname, strlen(hostname)) != 0)
        native_fail("cannot set the hostname", hostname);
    int sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq lo;
    memset(&lo, 0, sizeof lo);
    strcpy(lo.ifr_name, "lo");
    lo.ifr_flags = IFF_UP | IFF_LOOPBACK | IFF_RUNNING; /* the kernel gives it 127.0.0.1 */
    if (sock < 0 || ioctl(sock, SIOCSIFFLAGS, &lo) != 0)
        native_fail("cannot bring up", "lo");
    close(sock);
    mode_t old_umask = umask(0);
    /* bwrap's mount dance: everything slave (no mount reaches the host's namespace), a tmpfs
     * holding newroot and oldroot, pivot into it, build newroot from /oldroot, drop oldroot,
     * pivot into newroot. */
    const char *base = "/tmp";
    if (mount(NULL, "/", NULL, MS_SLAVE | MS_REC, NULL) != 0 ||
        mount("tmpfs", base, "tmpfs", MS_NODEV | MS_NOSUID, NULL) != 0 || chdir(base) != 0 ||
        mkdir("newroot", 0755) != 0 ||
        mount("newroot", "newroot", NULL, MS_BIND | MS_REC, NULL) != 0 ||
        mkdir("oldroot", 0755) != 0 || syscall(SYS_pivot_root, base, "oldroot") != 0 ||
        chdir("/") != 0)
        native_fail("cannot make the new root", NULL);
    for (size_t k = 0; k < count; k++)
        run_op(&ops[k]);
    int oldroot = open("/", O_DIRECTORY | O_RDONLY | O_CLOEXEC);
    if (mount("oldroot", "oldroot", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        umount2("oldroot", MNT_DETACH) != 0 || oldroot < 0 || chdir("/newroot") != 0 ||
        syscall(SYS_pivot_root, ".", ".") != 0 || fchdir(oldroot) != 0 ||
        umount2(".", MNT_DETACH) != 0 || chdir("/") != 0)
        native_fail("cannot enter the new root", NULL);
    close(oldroot);
    /* The sandbox's ids, in a second user namespace that owns none of the others; with
     * --disable-userns the first may hold only that one, so no process inside can make
     * another (checked). */
    if (disable_userns) {
        int limit = openat(proc_fd, "sys/user/max_user_namespaces", O_WRONLY | O_CLOEXEC);
        if (limit < 0 || write(limit, "1", 1) != 1)
            native_fail("cannot limit user namespaces", NULL);
        close(limit);
    }
    if (unshare(CLONE_NEWUSER) != 0)
        native_fail("cannot make the second user namespace", NULL);
    map_ids(proc_fd, uid, 0, gid, 0);
    close(proc_fd);
    if (disable_userns && unshare(CLONE_NEWUSER) == 0) {
        errno = EPERM;
        native_fail("user namespaces were not disabled", NULL);
    }
    drop_capabilities();
    static char program[65536];
    struct sock_fprog filter = {0, NULL};
    if (seccomp_fd >= 0) {
        size_t length = 0;
        for (;;) {
            ssize_t got = read(seccomp_fd, program + length, sizeof program - length);
            if (got < 0 && errno == EINTR)
                continue;
            if (got < 0)
                native_fail("cannot read the seccomp filter", NULL);
            if (got == 0)
                break;
            length += (size_t)got;
            if (length == sizeof program) {
                errno = E2BIG;
                native_fail("seccomp filter", NULL);
            }
        }
        if (length == 0 || length % sizeof(struct sock_filter) != 0) {
            errno = EINVAL;
            native_fail("seccomp filter", NULL);
        }
        close(seccomp_fd);
        filter.len = (unsigned short)(length / sizeof(struct sock_filter));
        filter.filter = (struct sock_filter *)program;
    }
    umask(old_umask);
    const char *pwd = cwd ? cwd : "/";
    if (chdir(pwd) != 0)
        native_fail("cannot change directory to", pwd);
    if (setenv("PWD", pwd, 1) != 0 || (new_session && setsid() < 0))
        native_fail("cannot start a session", NULL);
    if (die_with_parent && prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
        native_fail("cannot die with parent", NULL);
    if (write(ready[1], "", 1) != 1)
        native_fail("cannot report to the monitor", NULL);
    close(ready[1]);
    /* Last before exec, as bwrap: nothing after it needs a call the filter refuses. */
    if (filter.filter && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &filter) != 0)
        native_fail("cannot load the seccomp filter", NULL);
    execvp(command[0], command);
    native_fail("cannot execute", command[0]);
    return 125;
}

int main(int argc, char **argv) {
    if (argc > 3 && strcmp(argv[1], "--init") == 0 && strcmp(argv[2], "--") == 0)
        return init(argv + 3, NULL, NULL, -1);
    if (argc == 3 && strcmp(argv[1], "--init-wait") == 0)
        return init_wait(argv[2]);
    int i = 1, native_launch = 0;
    for (; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            i++;
            break;
        }
        if (strcmp(argv[i], "--native") == 0) {
            native_launch = 1;
            continue;
        }
        if (strcmp(argv[i], "--join") == 0 && i + 1 < argc) {
            const char *path = argv[++i];
            int fd = open(path, O_WRONLY | O_CLOEXEC);
            if (fd < 0 || write(fd, "0", 1) != 1)
                fail("cannot join cgroup", path);
            close(fd);
        } else if (strcmp(argv[i], "--rlimit") == 0 && i + 2 < argc) {
            int resource = (int)number(argv[i + 1]);
            struct rlimit limit;
            limit.rlim_cur = limit.rlim_max = (rlim_t)number(argv[i + 2]);
            if (setrlimit(resource, &limit) != 0)
                fail("cannot set rlimit", argv[i + 1]);
            i += 2;
        } else if (strcmp(argv[i], "--ids") == 0 && i + 2 < argc) {
            uid_t uid = (uid_t)number(argv[i + 1]);
            gid_t gid = (gid_t)number(argv[i + 2]);
            i += 2;
            if (setgroups(0, NULL) != 0)
                fail("cannot clear groups", NULL);
            if (setresgid(gid, gid, gid) != 0)
                fail("cannot set gid", argv[i]);
            if (setresuid(uid, uid, uid) != 0)
                fail("cannot set uid", argv[i - 1]);
            /* As setpriv does: the drop must be final (no saved id, no way back to root). */
            uid_t r, e, s;
            gid_t rg, eg, sg;
            if (getresuid(&r, &e, &s) != 0 || r != uid || e != uid || s != uid ||
                getresgid(&rg, &eg, &sg) != 0 || rg != gid || eg != gid || sg != gid ||
                getgroups(0, NULL) != 0) {
                errno = EPERM;
                fail("ids not dropped", NULL);
            }
            if (uid != 0 && (setresuid(0, 0, 0) == 0 || setresgid(0, 0, 0) == 0)) {
                errno = EPERM;
                fail("could regain root after the drop", NULL);
            }
        } else {
            errno = EINVAL;
            fail("bad argument", argv[i]);
        }
    }
    if (i >= argc || argv[i][0] != '/') {
        errno = EINVAL;
        fail("no absolute program to run", i < argc ? argv[i] : NULL);
    }
    if (native_launch)
        return native(argv + i + 1);
    execv(argv[i], argv + i);
    fail("cannot exec", argv[i]);
    return 125;
}
