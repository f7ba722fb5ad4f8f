// Where the SDK says what it does (connects, drains, reconnects, stops). A
// library should not print unasked: the default logger only reports warnings
// and errors, to stderr; pass `logger` for more, or a silent one.

/** Structured fields logged with a message. */
export type LogFields = Record<string, unknown>;

export interface Logger {
  debug(message: string, fields?: LogFields): void;
  info(message: string, fields?: LogFields): void;
  warn(message: string, fields?: LogFields): void;
  error(message: string, fields?: LogFields): void;
}

function line(level: string, message: string, fields?: LogFields): string {
  const extra = fields && Object.keys(fields).length > 0 ? ` ${JSON.stringify(fields)}` : "";
  return `${new Date().toISOString()} ${level} spool: ${message}${extra}`;
}

/** Every level to stderr, one line each (what the examples use). */
export const consoleLogger: Logger = {
  debug: () => {},
  info: (m, f) => console.error(line("INFO", m, f)),
  warn: (m, f) => console.error(line("WARN", m, f)),
  error: (m, f) => console.error(line("ERROR", m, f)),
};

/** Warnings and errors only: the default. */
export const quietLogger: Logger = {
  debug: () => {},
  info: () => {},
  warn: consoleLogger.warn,
  error: consoleLogger.error,
};

/** Nothing at all. */
export const silentLogger: Logger = {
  debug: () => {},
  info: () => {},
  warn: () => {},
  error: () => {},
};
