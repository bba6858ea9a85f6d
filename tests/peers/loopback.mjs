// Node preload (`node --import ./loopback.mjs server.js`): every TCP server listens on 127.0.0.1 only.
// Third-party servers such as server-everything call `app.listen(PORT)`, which binds every interface;
// the tests must never expose a server beyond the loopback interface, so a listen call that names no
// host gets 127.0.0.1. Calls that name a host, a path or a handle are left as they are.
import net from "node:net";

const LOOPBACK = "127.0.0.1";
const originalListen = net.Server.prototype.listen;

net.Server.prototype.listen = function listenOnLoopback(...args) {
    const [first, second] = args;
    if (typeof first === "object" && first !== null && !Array.isArray(first)) {
        if ("port" in first && first.host === undefined && first.path === undefined) {
            args[0] = { ...first, host: LOOPBACK };
        }
    } else if (typeof first === "number" || (typeof first === "string" && /^\d+$/.test(first))) {
        if (typeof second !== "string") {
            args.splice(1, 0, LOOPBACK);
        }
    } else if (first === undefined || typeof first === "function") {
        args.splice(0, 0, 0, LOOPBACK);
    }
    return originalListen.apply(this, args);
};
