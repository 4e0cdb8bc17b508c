// The scenarios of tests/drivers through pgjdbc: one line per scenario on stdout,
// tab-separated, read by test_drivers.py.
//
//   java -cp postgresql.jar:. Scenarios <jdbc url> <chain step> <failing step> <job> <lease job> <lease>
import java.sql.CallableStatement;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Types;

public class Scenarios {
    static void out(String... fields) {
        System.out.println(String.join("\t", fields));
    }

    // drain_job through a CallableStatement: the five results are INOUT arguments 6 to 10
    static String[] drain(Connection c, String job, String lease, String holder, Long generation)
            throws SQLException {
        try (CallableStatement cs = c.prepareCall("{call etc_batch.drain_job(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)}")) {
            cs.setString(1, job);
            cs.setNull(2, Types.INTEGER);
            cs.setString(3, lease);
            cs.setString(4, holder);
            if (generation == null) {
                cs.setNull(5, Types.BIGINT);
            } else {
                cs.setLong(5, generation);
            }
            cs.registerOutParameter(6, Types.INTEGER);
            cs.registerOutParameter(7, Types.BIGINT);
            cs.registerOutParameter(8, Types.VARCHAR);
            cs.registerOutParameter(9, Types.VARCHAR);
            cs.registerOutParameter(10, Types.VARCHAR);
            cs.execute();
            return new String[] {
                String.valueOf(cs.getInt(6)), String.valueOf(cs.getLong(7)),
                cs.getString(8), cs.getString(9), cs.getString(10)};
        }
    }

    public static void main(String[] a) throws Exception {
        String url = a[0];
        if (a[1].equals("escape")) {
            // the JDBC escape for a call, as pgjdbc sends it by default
            try (Connection c = DriverManager.getConnection(url);
                 CallableStatement cs = c.prepareCall("{call etc_batch.drain_job(?)}")) {
                cs.setString(1, a[2]);
                cs.execute();
                out("escape", "ok");
            } catch (SQLException e) {
                out("escape", e.getSQLState());
            }
            return;
        }
        if (a[1].equals("repeat")) {
            // the same statement nine times and nothing else (what a transaction-mode
            // pooler breaks)
            try (Connection c = DriverManager.getConnection(url);
                 PreparedStatement p = c.prepareStatement("SELECT status FROM etc_batch.job_summary(?)")) {
                for (int i = 0; i < 9; i++) {
                    p.setString(1, a[2]);
                    p.executeQuery().close();
                }
                out("repeat", "ok");
            } catch (SQLException e) {
                out("repeat", e.getSQLState());
            }
            return;
        }
        long chain = Long.parseLong(a[1]);
        long failing = Long.parseLong(a[2]);
        String job = a[3];
        String leaseJob = a[4];
        String lease = a[5];
        try (Connection c = DriverManager.getConnection(url)) {
            c.setAutoCommit(true);

            try (PreparedStatement p = c.prepareStatement("CALL etc_batch.exec_batch_from_id(?)")) {
                p.setLong(1, chain);
                p.execute();
            }
            out("chain", "ok");

            String[] drained = drain(c, job, null, null, null);
            out("job", drained[0], drained[1], drained[2], drained[3], drained[4]);

            // executed again and again: past the driver's prepareThreshold
            String status = null;
            for (int i = 0; i < 8; i++) {
                status = drain(c, job, null, null, null)[4];
                try (PreparedStatement p = c.prepareStatement("SELECT status FROM etc_batch.job_summary(?)")) {
                    p.setString(1, job);
                    try (ResultSet r = p.executeQuery()) {
                        r.next();
                        status = status + "/" + r.getString(1);
                    }
                }
            }
            out("repeated", status);

            try (PreparedStatement p = c.prepareStatement("CALL etc_batch.exec_batch_from_id(?)")) {
                p.setLong(1, failing);
                p.execute();
                out("failure", "none");
            } catch (SQLException e) {
                out("failure", e.getSQLState(), e.getMessage().split("\n")[0]);
            }

            c.setAutoCommit(false);
            try (PreparedStatement p = c.prepareStatement("CALL etc_batch.exec_batch_from_id(?)")) {
                p.setLong(1, chain);
                p.execute();
                out("autocommit_off", "none");
            } catch (SQLException e) {
                out("autocommit_off", e.getSQLState());
            }
            c.rollback();
            c.setAutoCommit(true);

            long generation;
            try (PreparedStatement p = c.prepareStatement(
                    "SELECT acquired, generation FROM etc_batch.acquire_lease(?, 'jdbc', '1 hour')")) {
                p.setString(1, lease);
                try (ResultSet r = p.executeQuery()) {
                    r.next();
                    generation = r.getLong(2);
                }
            }
            try {
                drain(c, leaseJob, lease, "jdbc", generation + 1);
                out("fenced", "none");
            } catch (SQLException e) {
                out("fenced", e.getSQLState());
            }
            out("leased", drain(c, leaseJob, lease, "jdbc", generation)[4]);
        }
    }
}
